# Install rules and the CMake package: find_package(moekit CONFIG) gives moekit::moekit
# (libmoekit.a, the public headers with the generated moekit/version.h).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MOEKIT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/moekit)

install(TARGETS moekit EXPORT moekitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT moekit
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/moekit ${PROJECT_BINARY_DIR}/include/moekit
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT moekit FILES_MATCHING PATTERN "*.h")
install(EXPORT moekitTargets NAMESPACE moekit:: DESTINATION ${MOEKIT_INSTALL_CMAKEDIR}
        COMPONENT moekit)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moekitConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/moekitConfig.cmake
                              INSTALL_DESTINATION ${MOEKIT_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/moekitConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/moekitConfig.cmake ${PROJECT_BINARY_DIR}/moekitConfigVersion.cmake
        DESTINATION ${MOEKIT_INSTALL_CMAKEDIR} COMPONENT moekit)
