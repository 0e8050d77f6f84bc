# Optional NCCL group reducer (worker/nccl_group.h), included from worker/CMakeLists.txt.
#   ONLINEPS_WITH_NCCL=OFF   never build it (the default: a CUDA toolkit on the build
#                            machine does not turn CUDA code on by itself)
#                     ON     build it; configure fails without CUDA and NCCL >= 2.14
#                     AUTO   build it when the CUDA toolkit and NCCL >= 2.14 are found
# Always generates ${CMAKE_BINARY_DIR}/generated/worker/gpu_config.h (ONLINEPS_HAVE_NCCL
# 0 or 1) and sets the global CMake variable ONLINEPS_HAVE_NCCL (for tests/).
# Hints: NCCL_ROOT (CMake or environment variable), else the CUDA toolkit, /usr/local/cuda.
set(ONLINEPS_WITH_NCCL OFF CACHE STRING "Build the NCCL group reducer: OFF, ON or AUTO")
set_property(CACHE ONLINEPS_WITH_NCCL PROPERTY STRINGS OFF ON AUTO)

string(TOUPPER "${ONLINEPS_WITH_NCCL}" _onlineps_nccl_mode)
if(_onlineps_nccl_mode MATCHES "^(ON|YES|TRUE|Y|1)$")
  set(_onlineps_nccl_mode ON)
elseif(_onlineps_nccl_mode MATCHES "^(OFF|NO|FALSE|N|0)$")
  set(_onlineps_nccl_mode OFF)
elseif(NOT _onlineps_nccl_mode STREQUAL "AUTO")
  message(FATAL_ERROR "ONLINEPS_WITH_NCCL must be OFF, ON or AUTO, got '${ONLINEPS_WITH_NCCL}'")
endif()

set(_onlineps_nccl_why "")
if(_onlineps_nccl_mode STREQUAL "OFF")
  set(_onlineps_nccl_why "ONLINEPS_WITH_NCCL=OFF (-DONLINEPS_WITH_NCCL=ON or AUTO builds it)")
else()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    set(_onlineps_nccl_why "CUDA toolkit not found (set CUDAToolkit_ROOT)")
  else()
    set(_onlineps_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
                             ${CUDAToolkit_TARGET_DIR} /usr/local/cuda)
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS ${_onlineps_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY nccl
      HINTS ${_onlineps_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
      PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
    mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
    if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
      set(_onlineps_nccl_why "NCCL not found (nccl.h: ${NCCL_INCLUDE_DIR}, libnccl: ${NCCL_LIBRARY}; set NCCL_ROOT)")
    else()
      file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _onlineps_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR) +[0-9]+")
      string(REGEX REPLACE ".*NCCL_MAJOR +([0-9]+).*" "\\1" _onlineps_nccl_major "${_onlineps_nccl_version}")
      string(REGEX REPLACE ".*NCCL_MINOR +([0-9]+).*" "\\1" _onlineps_nccl_minor "${_onlineps_nccl_version}")
      set(NCCL_VERSION "${_onlineps_nccl_major}.${_onlineps_nccl_minor}")
      if(NCCL_VERSION VERSION_LESS 2.14)
        set(_onlineps_nccl_why "NCCL ${NCCL_VERSION} at ${NCCL_LIBRARY} is older than 2.14")
      endif()
    endif()
  endif()
endif()

if(_onlineps_nccl_why STREQUAL "")
  set(ONLINEPS_HAVE_NCCL ON CACHE INTERNAL "onlineps_worker_nccl is built")
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION ${NCCL_LIBRARY} INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  endif()
  add_library(onlineps_worker_nccl nccl_group.cc)
  target_link_libraries(onlineps_worker_nccl PUBLIC onlineps_common PRIVATE CUDA::cudart NCCL::nccl)
  message(STATUS "onlineps: NCCL group reducer ON (NCCL ${NCCL_VERSION}: ${NCCL_LIBRARY}, CUDA ${CUDAToolkit_VERSION})")
elseif(_onlineps_nccl_mode STREQUAL "ON")
  message(FATAL_ERROR "onlineps: ONLINEPS_WITH_NCCL=ON, but ${_onlineps_nccl_why}")
else()
  set(ONLINEPS_HAVE_NCCL OFF CACHE INTERNAL "onlineps_worker_nccl is built")
  message(STATUS "onlineps: NCCL group reducer skipped: ${_onlineps_nccl_why}")
endif()

configure_file(${CMAKE_CURRENT_LIST_DIR}/gpu_config.h.in
               ${CMAKE_BINARY_DIR}/generated/worker/gpu_config.h @ONLY)
target_include_directories(onlineps_worker_core PUBLIC ${CMAKE_BINARY_DIR}/generated)
