# Dataset loaders and SHA-256 (replay/dataset.h), on the real installed datasets
# (scripts/setup.sh installs them; a missing one fails, it is not skipped).
onlineps_test(dataset_test onlineps_replay_data ZLIB::ZLIB)
