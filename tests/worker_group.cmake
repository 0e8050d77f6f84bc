# GroupReducer tests: LocalGroup always (threads and processes on inproc/ipc/tcp); the
# NCCL cases only when onlineps_worker_nccl is built, skipped at run time without a GPU.
onlineps_test(group_reducer_test onlineps_worker_core)
if(ONLINEPS_HAVE_NCCL)
  target_link_libraries(group_reducer_test PRIVATE onlineps_worker_nccl)
endif()
