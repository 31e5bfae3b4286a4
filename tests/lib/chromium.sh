# browse WORK ARGS...: headless Chromium (Debian's `chromium`) with a fresh
# profile under WORK, no network (a dead proxy), no GPU; the page's console
# goes to stderr as ':CONSOLE' lines (logging at INFO level).
browse() {
  local work=$1; shift
  timeout 60 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --user-data-dir="$work/profile" --proxy-server=127.0.0.1:9 --proxy-bypass-list='<-loopback>' \
    --enable-logging=stderr --v=0 "$@"
}
