#!/usr/bin/env bash
# A supervised service on the cluster's head, without systemd: a supervisor loop that waits for
# the shared volume, runs the command, restarts it when it exits, and is found again by its pid
# file (never by searching command lines: Ray runs head commands inside
# `bash --login -c -i '... (cmd)'`, whose own command line contains the text a `pgrep -f` would
# look for, so such a check always finds itself and never starts anything).
#
#   service.sh start NAME [--ready-url URL] -- COMMAND [ARGS...]   start it unless it runs; wait until URL answers
#   service.sh stop NAME                                            stop the supervisor and its command
#   service.sh status NAME                                          exit 0 when it runs
#
# Environment: SERVICE_DIR (pid files and logs; default ~/.rerank-lab/services), SERVICE_WAIT_FOR_MOUNT
# (a mount point the command needs, waited for up to SERVICE_MOUNT_TIMEOUT seconds; default none),
# SERVICE_READY_TIMEOUT (seconds `start` waits for --ready-url, default 180), SERVICE_MAX_RESTARTS
# (restarts within 10 minutes before the supervisor gives up, default 5).
set -euo pipefail

dir="${SERVICE_DIR:-$HOME/.rerank-lab/services}"
action="${1:-}"; name="${2:-}"
[[ -n "$action" && -n "$name" ]] || { echo "usage: $0 start|stop|status|supervise NAME ..." >&2; exit 2; }
shift 2
pidfile="$dir/$name.pid"; childfile="$dir/$name.child.pid"; log="$dir/$name.log"
mkdir -p "$dir"

# The supervisor of NAME runs: its pid file names a live process whose own command line is this
# script supervising NAME (a pid reused by another process after a reboot does not count).
running() {
    local pid
    pid="$(cat "$pidfile" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "service.sh supervise $name " || return 1
    echo "$pid"
}

answers() {  # an HTTP 2xx from the URL (curl, else Python's urllib)
    if command -v curl > /dev/null; then curl -fs -o /dev/null --max-time 2 "$1"; return; fi
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" 2> /dev/null
}

supervise() {  # the loop itself (started detached by `start`)
    local child="" restarts=() code
    echo $$ > "$pidfile"
    trap '[[ -n "$child" ]] && kill -TERM -- "-$child" 2>/dev/null; rm -f "$pidfile" "$childfile"; exit 0' TERM INT
    if [[ -n "${SERVICE_WAIT_FOR_MOUNT:-}" ]]; then
        local waited=0
        until mountpoint -q "$SERVICE_WAIT_FOR_MOUNT"; do
            if (( waited >= ${SERVICE_MOUNT_TIMEOUT:-600} )); then
                echo "$(date -Is) $name: $SERVICE_WAIT_FOR_MOUNT is not mounted after ${waited}s: not starting" >&2
                rm -f "$pidfile"; exit 1
            fi
            sleep 5; waited=$((waited + 5))
        done
    fi
    while true; do
        echo "$(date -Is) $name: starting: $*"
        setsid "$@" &    # its own process group: stopping it stops what it started (e.g. uvicorn workers)
        child=$!
        echo "$child" > "$childfile"
        code=0; wait "$child" || code=$?
        child=""
        now=$(date +%s)
        restarts=("${restarts[@]+"${restarts[@]}"}" "$now")
        local recent=()
        for t in "${restarts[@]}"; do (( now - t < 600 )) && recent+=("$t"); done
        restarts=("${recent[@]}")
        if (( ${#restarts[@]} > ${SERVICE_MAX_RESTARTS:-5} )); then
            echo "$(date -Is) $name: exited with code $code, ${#restarts[@]} times in 10 minutes: giving up (see above)" >&2
            rm -f "$pidfile" "$childfile"; exit 1
        fi
        echo "$(date -Is) $name: exited with code $code; restarting in 5s" >&2
        sleep 5
    done
}

case "$action" in
  start)
    ready_url=""
    if [[ "${1:-}" == "--ready-url" ]]; then ready_url="$2"; shift 2; fi
    [[ "${1:-}" == "--" ]] && shift
    (( $# > 0 )) || { echo "$0 start $name: no command given" >&2; exit 2; }
    exec 9> "$dir/$name.lock"
    flock 9      # two starts at once: the second sees the first's supervisor
    if pid="$(running)"; then
        echo "$name: already running (supervisor pid $pid, log $log)"
    else
        # setsid + nohup + no inherited descriptors: it outlives the ssh session Ray runs this in
        setsid nohup bash "$0" supervise "$name" "$@" >> "$log" 2>&1 < /dev/null &
        for ((i = 0; i < 50; i++)); do pid="$(running)" && break; sleep 0.1; done   # it writes its pid file first
        [[ -n "${pid:-}" ]] || { echo "$name: the supervisor did not start; the end of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }
        echo "$name: started (supervisor pid $pid, log $log)"
    fi
    flock -u 9
    if [[ -n "$ready_url" ]]; then
        for ((i = 0; i < ${SERVICE_READY_TIMEOUT:-180}; i++)); do
            if answers "$ready_url"; then echo "$name: answers at $ready_url"; exit 0; fi
            running > /dev/null || break
            sleep 1
        done
        echo "$name: does not answer at $ready_url; the end of $log:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
    ;;
  supervise) supervise "$@" ;;
  stop)
    if pid="$(running)"; then kill -TERM "$pid"; echo "$name: stopped (supervisor pid $pid)"; else echo "$name: not running"; fi
    ;;
  status)
    if pid="$(running)"; then echo "$name: running (supervisor pid $pid, command pid $(cat "$childfile" 2>/dev/null))"; else echo "$name: not running"; exit 1; fi
    ;;
  *) echo "usage: $0 start|stop|status NAME ..." >&2; exit 2 ;;
esac
