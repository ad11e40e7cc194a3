# The oldest CUDA toolkit freeride builds with: 12.5.
#
# Why 12.5 and not older:
# - Every driver call goes through cudaGetDriverEntryPointByVersion (CUDA 12.5), which
#   binds each entry point to the ABI version its PFN_*_vNNNNN type names whatever the
#   toolkit. Before 12.5 only cudaGetDriverEntryPoint exists, which hands out the version
#   matching the toolkit, so the same code would mean different functions per toolkit.
# - The default reserve, a green context, needs cuGreenCtxStreamCreate (CUDA 12.5), which
#   a 12.4 toolkit cannot even name: such a build could never keep the default.
# - Everything else a 12.5 toolkit has (the green-context calls and cuFuncGetParamInfo are
#   12.4). What only CUDA 13 headers have (CUdevSmResource's partition rules) is read under
#   `#if CUDA_VERSION >= 13000`, with the documented guideline in its place otherwise.
# The driver floor is the runtime's own (CUDA minor version compatibility): r525 for a
# 12.x build, r580 for a 13.x one. Older drivers than 12.5 (r555) lack green contexts, and
# 12.4 (r550) kernel parameter sizes; those fall back at run time.
#
# Included by CMakeLists.txt; also a script, so tests check the refusal without a CUDA 12
# compiler: cmake -DCUDAToolkit_VERSION=12.3 -P cmake/FreerideCudaFloor.cmake
set(FREERIDE_CUDA_FLOOR 12.5)

function(freeride_check_cuda_floor version)
  if(version VERSION_LESS FREERIDE_CUDA_FLOOR)
    message(FATAL_ERROR
      "freeride needs CUDA ${FREERIDE_CUDA_FLOOR} or later, found CUDA ${version}: "
      "cudaGetDriverEntryPointByVersion and cuGreenCtxStreamCreate are new in 12.5 "
      "(cmake/FreerideCudaFloor.cmake says why). Put a CUDA ${FREERIDE_CUDA_FLOOR}+ nvcc "
      "on PATH (a 12.x build runs on r525+ drivers, a 13.x build needs r580+), or build "
      "without the CUDA backend: FREERIDE_CUDA=0.")
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DEFINED CUDAToolkit_VERSION)
    message(FATAL_ERROR "script mode: pass -DCUDAToolkit_VERSION=<version>")
  endif()
  freeride_check_cuda_floor("${CUDAToolkit_VERSION}")
  message(STATUS "CUDA ${CUDAToolkit_VERSION}: at or above the floor ${FREERIDE_CUDA_FLOOR}")
endif()
