# Sourced from the repository root by recipes/common.sh and slurm/common.sh: checks of bad input, done before any
# step starts. Each failure is one `error:` line naming the variable and the fix, and exit 2.

fail() {
    echo "error: $*" >&2
    exit 2
}

require_count() {  # NAME VALUE: a whole number of at least 1 (processes)
    [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || fail "$1=$2 is not a whole number of at least 1. Fix: e.g. $1=2."
}

require_whole() {  # NAME VALUE: a whole number, 0 or more (a seed)
    [[ "$2" =~ ^[0-9]+$ ]] || fail "$1=$2 is not a whole number (0 or more). Fix: e.g. $1=42."
}

require_writable() {  # NAME FOLDER: the folder exists or can be made, and can be written (nothing is left behind)
    local where=$2 probe
    while [ ! -e "$where" ]; do where=$(dirname "$where"); done
    probe=$([ -d "$where" ] && mktemp -d "$where/.write-check.XXXXXX" 2>/dev/null) && rmdir "$probe" ||
        fail "$1=$2 cannot be made or written. Fix: pass a folder you can write."
}
