# Which CUDA runtime the moekit target hands to what links it. libmoekit.a only calls
# the runtime API, which the shared and the static runtime both provide, so the choice
# belongs to the final link:
#   Shared  CUDA::cudart: the default for a consumer (add_subdirectory, FetchContent),
#           as engines and PyTorch link it: one runtime in the process.
#   Static  CUDA::cudart_static: the default when moekit is the top-level project, so
#           that its tests, benchmark and Python extension run on machines without the
#           toolkit's libcudart.so (the binaries carried to the GPU machines).
#   None    no runtime (only the toolkit's headers): the consumer links one itself.
# An installed package chooses again at find_package time (cmake/moekitConfig.cmake.in).
if(PROJECT_IS_TOP_LEVEL)
  set(_moekit_runtime_default Static)
else()
  set(_moekit_runtime_default Shared)
endif()
set(MOEKIT_CUDA_RUNTIME "${_moekit_runtime_default}" CACHE STRING
    "CUDA runtime linked through the moekit target: Shared, Static or None")
set_property(CACHE MOEKIT_CUDA_RUNTIME PROPERTY STRINGS Shared Static None)

if(MOEKIT_CUDA_RUNTIME STREQUAL "Shared")
  set(MOEKIT_CUDART_TARGET CUDA::cudart)
elseif(MOEKIT_CUDA_RUNTIME STREQUAL "Static")
  set(MOEKIT_CUDART_TARGET CUDA::cudart_static)
elseif(MOEKIT_CUDA_RUNTIME STREQUAL "None")
  set(MOEKIT_CUDART_TARGET "")
else()
  message(FATAL_ERROR "MOEKIT_CUDA_RUNTIME='${MOEKIT_CUDA_RUNTIME}': use Shared, Static or None")
endif()
# What moekit's own executables (tests, bench, examples) link: the same runtime, the
# static one when the library carries none.
if(MOEKIT_CUDART_TARGET)
  set(MOEKIT_CUDART_EXE ${MOEKIT_CUDART_TARGET})
else()
  set(MOEKIT_CUDART_EXE CUDA::cudart_static)
endif()
