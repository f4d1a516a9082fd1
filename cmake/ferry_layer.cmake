# ferry_layer(NAME [DEPS...]) builds src/NAME/*.cpp (and *.cu) into the static library
# ferry_NAME linking ferry_DEP for each dependency. Sources are globbed per
# layer (CONFIGURE_DEPENDS re-globs on build) so that adding a file to a
# layer never needs an edit here.
#
# Files named *_avx2.cpp / *_avx512.cpp / *_avx512vnni.cpp are compiled for
# that ISA only; the code that calls into them checks the CPU at run time
# first.
function(ferry_layer name)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*.cpp
    ${PROJECT_SOURCE_DIR}/src/${name}/*.cu)
  add_library(ferry_${name} STATIC ${srcs})
  target_include_directories(ferry_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  foreach(dep ${ARGN})
    target_link_libraries(ferry_${name} PUBLIC ferry_${dep})
  endforeach()
  foreach(src ${srcs})
    if(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
    elseif(src MATCHES "_avx512vnni\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx2;-mfma;-mf16c;-Wno-maybe-uninitialized;-Wno-uninitialized")
    elseif(src MATCHES "_avx512\\.cpp$")
      # GCC 12's AVX-512 intrinsic headers use _mm512_undefined_* values
      # that trip -Wmaybe-uninitialized inside the headers themselves.
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c;-Wno-maybe-uninitialized;-Wno-uninitialized")
    endif()
  endforeach()
endfunction()
