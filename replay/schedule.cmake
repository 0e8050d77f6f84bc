# onlineps_replay_schedule: delay distributions and the virtual-clock schedule
# simulator (replay/schedule.h). Torch-free.
add_library(onlineps_replay_schedule delay.cc schedule.cc)
target_link_libraries(onlineps_replay_schedule PUBLIC onlineps_common)
