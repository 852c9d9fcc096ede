# Defines the imported target NCCL::nccl: the NCCL that libtorch loads (the nvidia-nccl wheel
# beside PyPI's torch) before the CUDA toolkit's, so that one NCCL serves the process.
# Needs find_package(Torch) first (TORCH_INSTALL_PREFIX). Used by the build and the package.
if(NOT TARGET NCCL::nccl)
  set(_nccl_hints)
  if(TORCH_INSTALL_PREFIX)
    list(APPEND _nccl_hints ${TORCH_INSTALL_PREFIX}/../nvidia/nccl)
  endif()
  list(APPEND _nccl_hints /usr/local/cuda)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_path(NCCL_INCLUDE_DIR nccl.h)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(NCCL::nccl INTERFACE IMPORTED GLOBAL)
    target_include_directories(NCCL::nccl INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(NCCL::nccl INTERFACE ${NCCL_LIBRARY})
  endif()
endif()
