# The SM90 GEMM kernels' translation units, generated at configure time: one line per
# unit, "KIND DTYPE [TILE_N]", each written from src/gemm/sm90/instances/KIND.cu.in into
# the build tree and compiled into moekit_gemm. One unit per line, so the units compile in
# parallel and adding a tile width or an input dtype is one line (plus its launcher's
# declaration in src/gemm/launch.h and the dispatch that picks it).
set(MOEKIT_SM90_INSTANCES
    "tile bf16 256"
    "tile f16 256"
    "tile bf16 192"
    "tile f16 192"
    "tile bf16 224"
    "tile f16 224"
    "pair bf16"
    "pair f16"
    "chain bf16"
    "chain f16")

# DTYPE -> the CuTe element type and the CUDA type of the problem's pointers.
set(_moekit_cute_t_bf16 "cutlass::bfloat16_t")
set(_moekit_cuda_t_bf16 "__nv_bfloat16")
set(_moekit_cute_t_f16 "cutlass::half_t")
set(_moekit_cuda_t_f16 "__half")

set(_moekit_instances_dir ${PROJECT_SOURCE_DIR}/src/gemm/sm90/instances)
set(_moekit_generated_dir ${PROJECT_BINARY_DIR}/generated/gemm/sm90)
set(_moekit_generated)
foreach(_entry IN LISTS MOEKIT_SM90_INSTANCES)
  string(REPLACE " " ";" _fields "${_entry}")
  list(GET _fields 0 _kind)
  list(GET _fields 1 DTYPE)
  set(_name ${_kind}_${DTYPE})
  set(TILE_N 256)
  list(LENGTH _fields _n)
  if(_n GREATER 2)
    list(GET _fields 2 TILE_N)
    set(_name ${_kind}_n${TILE_N}_${DTYPE})
  endif()
  if(NOT DEFINED _moekit_cute_t_${DTYPE})
    message(FATAL_ERROR "MOEKIT_SM90_INSTANCES: unknown dtype '${DTYPE}' in '${_entry}'")
  endif()
  set(CUTE_T ${_moekit_cute_t_${DTYPE}})
  set(CUDA_T ${_moekit_cuda_t_${DTYPE}})
  set(_out ${_moekit_generated_dir}/${_name}.cu)
  configure_file(${_moekit_instances_dir}/${_kind}.cu.in ${_out} @ONLY)
  target_sources(moekit_gemm PRIVATE ${_out})
  list(APPEND _moekit_generated ${_out})
endforeach()

# Units of entries since removed from the list.
file(GLOB _moekit_stale ${_moekit_generated_dir}/*.cu)
list(REMOVE_ITEM _moekit_stale ${_moekit_generated})
if(_moekit_stale)
  file(REMOVE ${_moekit_stale})
endif()
