# Defines the imported target UCX::ucp (UCP and UCS) when UCX is found: through pkg-config
# where it is installed, else by searching for the header and the libraries (a GPU machine's
# UCX unpacked from Debian packages into a prefix on CMAKE_PREFIX_PATH, without pkg-config).
# Used by the build and by the installed package's config.
if(NOT TARGET UCX::ucp)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(UCX QUIET IMPORTED_TARGET GLOBAL ucx)
  endif()
  if(TARGET PkgConfig::UCX)
    add_library(UCX::ucp INTERFACE IMPORTED GLOBAL)
    target_link_libraries(UCX::ucp INTERFACE PkgConfig::UCX)
  else()
    find_path(UCX_UCP_INCLUDE_DIR ucp/api/ucp.h)
    find_library(UCX_UCP_LIBRARY ucp)
    find_library(UCX_UCS_LIBRARY ucs)
    if(UCX_UCP_INCLUDE_DIR AND UCX_UCP_LIBRARY AND UCX_UCS_LIBRARY)
      add_library(UCX::ucp INTERFACE IMPORTED GLOBAL)
      target_include_directories(UCX::ucp INTERFACE ${UCX_UCP_INCLUDE_DIR})
      target_link_libraries(UCX::ucp INTERFACE ${UCX_UCP_LIBRARY} ${UCX_UCS_LIBRARY})
    endif()
  endif()
endif()
