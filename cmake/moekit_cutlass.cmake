# Finds the CUTLASS/CuTe headers (TMA, wgmma atoms, mbarrier pipelines) that the SM90
# GEMM kernels include, and adds them to moekit_gemm (privately: moekit's public headers
# do not include CUTLASS, so consumers never need it). Tried in order:
#   1. MOEKIT_CUTLASS_INCLUDE (cache or environment): a folder holding cute/ and cutlass/.
#   2. CUTLASS_DIR (cache or environment): a CUTLASS checkout or install prefix (its include/).
#   3. A CUTLASS CMake package: the target nvidia::cutlass::CUTLASS when the consumer has
#      one, else find_package(NvidiaCutlass 4.2 CONFIG) (CUTLASS's own install).
#   4. For moekit's own builds (MOEKIT_CUTLASS_FROM_PYTHON, on when moekit is the top-level
#      project): the PyPI package nvidia-cutlass==4.2.0.0 that scripts/install-deps pins,
#      asked of each Python at hand (the project's build/venv first).
# moekit is built and tested against CUTLASS 4.2.0.

set(MOEKIT_CUTLASS_INCLUDE "$ENV{MOEKIT_CUTLASS_INCLUDE}" CACHE PATH
    "CUTLASS include dir (holds cute/ and cutlass/)")
set(CUTLASS_DIR "$ENV{CUTLASS_DIR}" CACHE PATH "CUTLASS checkout or install prefix")
option(MOEKIT_CUTLASS_FROM_PYTHON "Find CUTLASS through the PyPI package nvidia-cutlass"
       ${PROJECT_IS_TOP_LEVEL})

set(_moekit_cute_probe "cute/atom/mma_traits_sm90_gmma.hpp")

if(NOT MOEKIT_CUTLASS_INCLUDE AND CUTLASS_DIR)
  if(EXISTS "${CUTLASS_DIR}/include/${_moekit_cute_probe}")
    set(MOEKIT_CUTLASS_INCLUDE "${CUTLASS_DIR}/include" CACHE PATH
        "CUTLASS include dir (holds cute/ and cutlass/)" FORCE)
  else()
    message(FATAL_ERROR "CUTLASS_DIR='${CUTLASS_DIR}' has no include/${_moekit_cute_probe}")
  endif()
endif()

if(NOT MOEKIT_CUTLASS_INCLUDE)
  if(NOT TARGET nvidia::cutlass::CUTLASS)
    find_package(NvidiaCutlass 4.2 CONFIG QUIET)  # older CuTe lacks what the kernels use
  endif()
  if(TARGET nvidia::cutlass::CUTLASS)
    message(STATUS "moekit: CUTLASS from the CMake package nvidia::cutlass::CUTLASS "
                   "(${NvidiaCutlass_VERSION}; moekit is tested with 4.2.0)")
    target_link_libraries(moekit_gemm PRIVATE nvidia::cutlass::CUTLASS)
    return()
  endif()
endif()

if(NOT MOEKIT_CUTLASS_INCLUDE AND MOEKIT_CUTLASS_FROM_PYTHON)
  # Ask each Python at hand (the pip build's may differ from the one install-deps used).
  find_package(Python3 COMPONENTS Interpreter QUIET)
  find_program(_moekit_python3 python3)
  foreach(_py "${PROJECT_SOURCE_DIR}/build/venv/bin/python3" ${Python3_EXECUTABLE}
              ${Python_EXECUTABLE} ${_moekit_python3})
    if(NOT EXISTS "${_py}")
      continue()
    endif()
    execute_process(
      COMMAND "${_py}" -c
              "import cutlass_library,os;print(os.path.join(os.path.dirname(cutlass_library.__file__),'source','include'))"
      OUTPUT_VARIABLE _moekit_cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_moekit_cutlass_inc AND EXISTS "${_moekit_cutlass_inc}/cute")
      set(MOEKIT_CUTLASS_INCLUDE "${_moekit_cutlass_inc}" CACHE PATH
          "CUTLASS include dir (holds cute/ and cutlass/)" FORCE)
      break()
    endif()
  endforeach()
endif()

if(NOT EXISTS "${MOEKIT_CUTLASS_INCLUDE}/${_moekit_cute_probe}")
  message(FATAL_ERROR
    "CUTLASS headers not found (MOEKIT_CUTLASS_INCLUDE='${MOEKIT_CUTLASS_INCLUDE}'). Pass "
    "-DMOEKIT_CUTLASS_INCLUDE=<cutlass>/include or -DCUTLASS_DIR=<cutlass checkout or prefix>, "
    "install CUTLASS's CMake package (NvidiaCutlass), or, for moekit's own builds, run "
    "scripts/install-deps (pip install nvidia-cutlass==4.2.0.0).")
endif()
message(STATUS "moekit: CUTLASS headers in ${MOEKIT_CUTLASS_INCLUDE}")
target_include_directories(moekit_gemm SYSTEM PRIVATE ${MOEKIT_CUTLASS_INCLUDE})
