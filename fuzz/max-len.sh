# The longest input each target is given, shared by run.sh and run-long.sh. Longer inputs add
# time per run and no new shapes: every format here has fixed-size headers and length-prefixed
# fields that a few kilobytes exercise. The segment scanner resynchronises byte by byte over
# damage (three times per input: recovery, read-only open, verify), so its inputs are kept to
# 1 KiB, still room for some twenty frames across several read chunks and index entries.
max_len() {
  case "$1" in
    segment_scan) echo 1024 ;;
    *) echo 4096 ;;
  esac
}
