# Sourced by the install scripts: the Debian mirror the system's apt already uses (deb822
# sources first, then the one-line format's bookworm entry), for their private apt configs.
debian_mirror() {
    local m
    m=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    [ -n "$m" ] || m=$(awk '$1=="deb" && $3 ~ /^bookworm$/ {print $2; exit}' \
        /etc/apt/sources.list 2>/dev/null || true)
    echo "${m:-http://deb.debian.org/debian}"
}
