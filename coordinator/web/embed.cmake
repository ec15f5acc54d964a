# Writes the dashboard's files (coordinator/web/*.html, *.js, *.css) into one .cpp of byte arrays,
# web_files() of coordinator/src/dashboard.h, so that kiln-coordinator needs no file at run time.
#   cmake -DDIR=coordinator/web -DOUT=build/.../web_files.cpp -P coordinator/web/embed.cmake
file(GLOB files ${DIR}/*.html ${DIR}/*.js ${DIR}/*.css)
list(SORT files)
set(arrays "")
set(table "")
set(n 0)
foreach(f IN LISTS files)
  file(READ ${f} hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  get_filename_component(name ${f} NAME)
  string(APPEND arrays "const unsigned char k${n}[] = {${hex}};\n")
  string(APPEND table "      {\"${name}\", {reinterpret_cast<const char*>(k${n}), sizeof k${n}}},\n")
  math(EXPR n "${n} + 1")
endforeach()
file(WRITE ${OUT}
     "// Generated from coordinator/web by coordinator/web/embed.cmake: do not edit.\n"
     "#include \"dashboard.h\"\n\nnamespace kiln::coord {\nnamespace {\n${arrays}}  // namespace\n\n"
     "std::span<const WebFile> web_files() {\n  static const WebFile files[] = {\n${table}  };\n"
     "  return files;\n}\n\n}  // namespace kiln::coord\n")
