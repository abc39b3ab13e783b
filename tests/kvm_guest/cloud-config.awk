# The part of cloud-config the test guest applies (docs/kvm-provider.md):
# `hostname:` (printed on stdout) and `write_files:` entries with `path:`
# and `content:`, the content a literal block (`|`) or a one-line scalar.
# Files are written here; everything else is ignored.
function unquote(s) {
  sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s)
  if (s ~ /^".*"$/ || s ~ /^'.*'$/) s = substr(s, 2, length(s) - 2)
  return s
}
function flush(  dir) {
  if (path != "") {
    dir = path; sub(/\/[^\/]*$/, "", dir)
    if (dir != "") system("mkdir -p '" dir "'")
    printf "%s", content > path
    close(path)
    print "epo-guest: wrote " path > "/dev/stderr"
  }
  path = ""; content = ""; inblock = 0
}
inblock {
  if ($0 ~ /^[ \t]*$/) { content = content "\n"; next }
  match($0, /^ */)
  if (bind < 0) bind = RLENGTH
  if (RLENGTH >= bind && RLENGTH > kind) { content = content substr($0, bind + 1) "\n"; next }
  inblock = 0
}
/^[^ \t#-]/ { flush(); section = "" }
/^hostname:/ { host = $0; sub(/^hostname:/, "", host); host = unquote(host); next }
/^write_files:/ { section = "wf"; next }
section == "wf" {
  line = $0
  if (line ~ /^[ ]*- /) { flush(); sub(/- /, "  ", line) }
  if (line ~ /^[ ]*path:/) { sub(/^[ ]*path:/, "", line); path = unquote(line); next }
  if (line ~ /^[ ]*content:[ ]*\|/) {
    match(line, /^ */); kind = RLENGTH; bind = -1; inblock = 1; content = ""; next
  }
  if (line ~ /^[ ]*content:/) { sub(/^[ ]*content:/, "", line); content = unquote(line) "\n"; next }
}
END { flush(); print host }
