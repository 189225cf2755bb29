# cmake -DPROG=path/to/program -DOUT=page.N -P manpage.cmake
# Runs PROG --help-man in an empty environment (so that no TPUEMU_* variable of
# the build machine changes a default the page shows) and writes its output.
get_filename_component(dir ${OUT} DIRECTORY)
file(MAKE_DIRECTORY ${dir})
# as every file the project writes: nothing planted at the temp name is
# followed (removed first: a link goes, not its target), and a page's name
# that is not a regular file is refused
if(IS_DIRECTORY ${OUT})
  message(FATAL_ERROR "${OUT} is a directory: refusing to write the manual page there")
endif()
file(REMOVE ${OUT}.tmp)
execute_process(
  COMMAND env -i ASAN_OPTIONS=detect_leaks=0 ${PROG} --help-man
  OUTPUT_FILE ${OUT}.tmp
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT}.tmp)
  message(FATAL_ERROR "${PROG} --help-man failed (${rc})")
endif()
file(RENAME ${OUT}.tmp ${OUT})
