# Offline checks of deploy/ (tests/deploy_lint.sh): yamllint; kustomize renders validated
# with kubernetes-models and the onlineps structure rules; promtool check config/rules and
# test rules; shellcheck; dockerfilelint; each pod's environment fed to the built
# binaries' --print-config. Needs kubectl, yamllint, shellcheck, node/npm (the npm registry
# on the first run) and promtool (unpacked by scripts/setup.sh); a missing tool fails the
# test, naming what to install. No cluster, no container engine.
add_test(NAME Deploy.ManifestsValidateOffline
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/deploy_lint.sh)
set_tests_properties(Deploy.ManifestsValidateOffline PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "deploy")
