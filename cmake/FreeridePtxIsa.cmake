# The PTX ISA version the CUDA compiler writes (".version 9.0" for CUDA 13.0), for the
# error a driver too old to JIT-compile the build's PTX raises (csrc/kernels/load_error.cu):
# the toolkit-to-ISA table changes with every release, and asking nvcc needs none.
# Sets `out` to e.g. "9.0", or "" where nvcc does not say.
function(freeride_ptx_isa out)
  set(dir "${CMAKE_BINARY_DIR}/freeride_ptx_isa")
  file(MAKE_DIRECTORY "${dir}")
  file(WRITE "${dir}/probe.cu" "__global__ void freeride_probe() {}\n")
  set(host "")
  if(CMAKE_CUDA_HOST_COMPILER)
    set(host -ccbin "${CMAKE_CUDA_HOST_COMPILER}")
  endif()
  execute_process(
    COMMAND "${CMAKE_CUDA_COMPILER}" ${host} -ptx "${dir}/probe.cu" -o "${dir}/probe.ptx"
    RESULT_VARIABLE result OUTPUT_QUIET ERROR_QUIET)
  set(isa "")
  if(result EQUAL 0 AND EXISTS "${dir}/probe.ptx")
    file(STRINGS "${dir}/probe.ptx" lines REGEX "^\\.version [0-9]+\\.[0-9]+")
    if(lines)
      list(GET lines 0 line)
      string(REGEX REPLACE "^\\.version ([0-9]+\\.[0-9]+).*" "\\1" isa "${line}")
    endif()
  endif()
  set(${out} "${isa}" PARENT_SCOPE)
endfunction()
