# Install rules: cmake --install <build> --prefix P puts
#   P/include/lockstep/<layer>/*.h        the headers, as they are under src/
#   P/lib/liblockstep.a                   the library
#   P/lib/cmake/Lockstep/                 the CMake package: find_package(Lockstep), target Lockstep::lockstep
#   P/lib/pkgconfig/lockstep.pc           the pkg-config file: pkg-config --cflags --libs lockstep
#   P/bin/lockstep                        the command (when LOCKSTEP_TOOLS is on)
# Both packages find the prefix from where they lie, so the tree can be installed anywhere
# (--prefix) and moved. Included from the top CMakeLists.txt once its targets exist.
include(CMakePackageConfigHelpers)

set(LOCKSTEP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Lockstep)

install(TARGETS lockstep_lib EXPORT LockstepTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Every header, the cuda/ ones too (they are only included by sources of CUDA builds).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/lockstep DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
if(TARGET lockstep)
  # The command links CUDA, NCCL and OpenBLAS from wherever they were found at build time;
  # installed, it keeps those directories (not the build tree's) in its RPATH.
  set_target_properties(lockstep PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS lockstep RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# The CMake package. The exported target carries only usage requirements (include
# directory, cxx_std_20, compile definitions, dependencies): the -march=native, warning and
# sanitizer flags of Lockstep's own build are directory options, not part of it.
install(EXPORT LockstepTargets NAMESPACE Lockstep:: DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR}
        FILE LockstepTargets.cmake)
# What LockstepConfig.cmake must find again: the dependencies of this build's options.
if(MPI_C_FOUND)
  set(LOCKSTEP_HAVE_MPI ON)
else()
  set(LOCKSTEP_HAVE_MPI OFF)
endif()
if(LOCKSTEP_HAVE_NCCL)
  # Hints only: the package looks under NCCL_HOME and the CUDA toolkit first.
  get_filename_component(LOCKSTEP_NCCL_LIBRARY_HINT "${NCCL_LIBRARY}" DIRECTORY)
  set(LOCKSTEP_NCCL_INCLUDE_HINT "${NCCL_INCLUDE_DIR}")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/LockstepConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/LockstepConfig.cmake
                              INSTALL_DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})
# 0.x versions break compatibility at the minor version (0.1 -> 0.2), later ones at the major.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(lockstep_compatibility SameMinorVersion)
else()
  set(lockstep_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/LockstepConfigVersion.cmake
                                 COMPATIBILITY ${lockstep_compatibility})
install(FILES ${PROJECT_BINARY_DIR}/LockstepConfig.cmake ${PROJECT_BINARY_DIR}/LockstepConfigVersion.cmake
        DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})

# The pkg-config file: the same requirements as flags. A dependency with a pkg-config module
# of its own goes into Requires (so its flags come from its .pc file); the others are spelled
# out from what CMake found. Libs carries them all (not Libs.private): the library is static.
# LOCKSTEP_VERSION is left out of Cflags: a quoted string define does not survive the shell's
# word splitting of $(pkg-config ...), and no header uses it (pkg-config --modversion lockstep).
set(lockstep_pc_requires openblas)
set(lockstep_pc_cflags "-std=c++20 -I\${includedir}")
set(lockstep_pc_libs "-L\${libdir} -llockstep")
# Requires <module> when pkg-config knows it here, else the flags given after it.
function(lockstep_pc_dependency module)
  pkg_check_modules(lockstep_pc_${module} QUIET ${module})
  if(lockstep_pc_${module}_FOUND)
    set(lockstep_pc_requires ${lockstep_pc_requires} ${module} PARENT_SCOPE)
  elseif(ARGN)
    list(JOIN ARGN " " flags)
    set(lockstep_pc_libs "${lockstep_pc_libs} ${flags}" PARENT_SCOPE)
  endif()
endfunction()
lockstep_pc_dependency(zlib ${ZLIB_LIBRARIES})
lockstep_pc_dependency(libcrypto ${OPENSSL_CRYPTO_LIBRARY})
lockstep_pc_dependency(nlohmann_json)  # header-only: nothing to link without its module
string(APPEND lockstep_pc_cflags " ${OpenMP_CXX_FLAGS}")
string(APPEND lockstep_pc_libs " ${OpenMP_CXX_FLAGS}")
if(LOCKSTEP_HAVE_MPI)
  string(APPEND lockstep_pc_cflags " -DLOCKSTEP_HAVE_MPI=1 -DOMPI_SKIP_MPICXX=1")
  foreach(dir IN LISTS MPI_C_INCLUDE_DIRS)
    string(APPEND lockstep_pc_cflags " -I${dir}")
  endforeach()
  foreach(option IN LISTS MPI_C_COMPILE_OPTIONS)
    string(APPEND lockstep_pc_cflags " ${option}")
  endforeach()
  foreach(definition IN LISTS MPI_C_COMPILE_DEFINITIONS)
    string(APPEND lockstep_pc_cflags " -D${definition}")
  endforeach()
  foreach(library IN LISTS MPI_C_LIBRARIES)
    string(APPEND lockstep_pc_libs " ${library}")
  endforeach()
  foreach(flag IN LISTS MPI_C_LINK_FLAGS)
    string(APPEND lockstep_pc_libs " ${flag}")
  endforeach()
endif()
if(LOCKSTEP_HAVE_NCCL)
  string(APPEND lockstep_pc_cflags " -DLOCKSTEP_HAVE_NCCL=1 -DLOCKSTEP_HAVE_CUDA=1")
  set(lockstep_pc_cuda_includes ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_INCLUDE_DIR})
  list(REMOVE_DUPLICATES lockstep_pc_cuda_includes)
  foreach(dir IN LISTS lockstep_pc_cuda_includes)
    string(APPEND lockstep_pc_cflags " -I${dir}")
  endforeach()
  string(APPEND lockstep_pc_libs " -L${CUDAToolkit_LIBRARY_DIR} -lcudart ${NCCL_LIBRARY}")
endif()
string(APPEND lockstep_pc_libs " -lpthread")
foreach(library IN LISTS CMAKE_DL_LIBS)
  string(APPEND lockstep_pc_libs " -l${library}")
endforeach()
list(JOIN lockstep_pc_requires " " lockstep_pc_requires)
# ${pcfiledir} is where the .pc file lies: the prefix is found from there.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(lockstep_pc_prefix "${CMAKE_INSTALL_PREFIX}")
  set(lockstep_pc_libdir "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH lockstep_pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" lockstep_pc_up "${lockstep_pc_up}")
  set(lockstep_pc_prefix "\${pcfiledir}/${lockstep_pc_up}")
  set(lockstep_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(lockstep_pc_includedir "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(lockstep_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/lockstep.pc.in ${PROJECT_BINARY_DIR}/lockstep.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/lockstep.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
