# The issue-6 experiment driver (experiments/run.py) in its --quick form: every experiment
# once on tiny data, checking that each run finished and wrote finite metrics and plots.
add_test(NAME Experiments.Smoke
         COMMAND python3 ${CMAKE_SOURCE_DIR}/experiments/run.py all --quick
                 --out ${CMAKE_BINARY_DIR}/experiments-smoke)
set_tests_properties(Experiments.Smoke PROPERTIES
  ENVIRONMENT "ONLINEPS_REPLAY=$<TARGET_FILE:onlineps_replay>"
  TIMEOUT 300
  LABELS "replay")
