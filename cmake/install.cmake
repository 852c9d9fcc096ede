# `cmake --install`: the libraries, the public headers (under include/pipetrain/, included as
# "pipeline/pipeline.h" and so on), the pipetrain binary, and a CMake package, so that a project
# writes find_package(pipetrain) and links pipetrain::pipetrain. The package finds libtorch
# again (CMAKE_PREFIX_PATH must name torch's, as for this build) and the optional backends.
include(CMakePackageConfigHelpers)

# What an embedding program links: the run layer, the engine and everything below them.
add_library(pipetrain_api INTERFACE)
target_link_libraries(pipetrain_api INTERFACE pipetrain_train)
set_target_properties(pipetrain_api PROPERTIES EXPORT_NAME pipetrain)
add_library(pipetrain::pipetrain ALIAS pipetrain_api)

set(_pipetrain_libraries pipetrain_base pipetrain_common pipetrain_schedule pipetrain_partitioner
    pipetrain_profiler pipetrain_models pipetrain_stages pipetrain_comm pipetrain_pipeline pipetrain_job pipetrain_checkpoint
    pipetrain_planner pipetrain_train pipetrain_api)
install(TARGETS ${_pipetrain_libraries} EXPORT pipetrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pipetrain)
install(TARGETS pipetrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

foreach(folder common schedule partitioner models stages comm profiler pipeline job checkpoint planner train)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pipetrain/${folder}
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${CMAKE_BINARY_DIR}/generated/common/config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pipetrain/common)

set(_pipetrain_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/pipetrain)
install(EXPORT pipetrainTargets NAMESPACE pipetrain:: DESTINATION ${_pipetrain_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pipetrainConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/pipetrainConfig.cmake INSTALL_DESTINATION ${_pipetrain_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/pipetrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/pipetrainConfig.cmake ${CMAKE_BINARY_DIR}/pipetrainConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/find_ucx.cmake ${PROJECT_SOURCE_DIR}/cmake/find_nccl.cmake
        DESTINATION ${_pipetrain_cmake_dir})
