# Sourced by .ci/run and examples/quickstart.sh: makes `cargo` of Rust 1.89
# or newer (the workspace's rust-version) available to the caller.
#
# - Found on PATH, or in ~/.cargo/env: used as it is.
# - rustup present but its default too old: the stable toolchain is installed
#   and selected for this shell only (RUSTUP_TOOLCHAIN), not made the default.
# - No Rust at all: rustup's own installer puts the stable toolchain (minimal
#   profile) in ~/.rustup and ~/.cargo, as https://rustup.rs would.
#
# NCCLEAN_NO_RUST_INSTALL=1 turns an install into an error that says what to
# install. A C linker (`cc`) is needed too; as root with apt it is installed,
# otherwise the error names the package.

ncclean_rust_ok() {
  command -v cargo >/dev/null 2>&1 || return 1
  local v major rest minor
  v=$(cargo --version 2>/dev/null | awk '{print $2}')
  major=${v%%.*}
  rest=${v#*.}
  minor=${rest%%.*}
  case "$major$minor" in '' | *[!0-9]*) return 1 ;; esac
  [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge 89 ]; }
}

ncclean_ensure_rust() {
  if ! ncclean_rust_ok && [ -f "$HOME/.cargo/env" ]; then
    . "$HOME/.cargo/env"
  fi
  if ! ncclean_rust_ok; then
    local have
    have=$(cargo --version 2>/dev/null || echo "no cargo")
    if [ "${NCCLEAN_NO_RUST_INSTALL:-0}" = 1 ]; then
      echo "error: ncclean needs Rust 1.89 or newer, and this machine has $have." >&2
      echo "  Install it with rustup (https://rustup.rs), or unset NCCLEAN_NO_RUST_INSTALL to let this script do it." >&2
      return 1
    fi
    echo "ncclean needs Rust 1.89 or newer ($have found): installing the stable toolchain with rustup (set NCCLEAN_NO_RUST_INSTALL=1 to stop this)" >&2
    if command -v rustup >/dev/null 2>&1; then
      rustup toolchain install stable --profile minimal || return 1
      export RUSTUP_TOOLCHAIN=stable
    else
      local triple tmp
      case "$(uname -s)-$(uname -m)" in
        Linux-x86_64) triple=x86_64-unknown-linux-gnu ;;
        Linux-aarch64) triple=aarch64-unknown-linux-gnu ;;
        Darwin-x86_64) triple=x86_64-apple-darwin ;;
        Darwin-arm64) triple=aarch64-apple-darwin ;;
        *)
          echo "error: no rustup installer known for $(uname -s) $(uname -m): install Rust 1.89+ from https://rustup.rs" >&2
          return 1
          ;;
      esac
      tmp=$(mktemp -d)
      if ! curl --proto '=https' --tlsv1.2 -sSf \
        "https://static.rust-lang.org/rustup/dist/$triple/rustup-init" -o "$tmp/rustup-init"; then
        echo "error: could not download rustup-init from static.rust-lang.org: install Rust 1.89+ from https://rustup.rs" >&2
        rm -rf "$tmp"
        return 1
      fi
      chmod +x "$tmp/rustup-init"
      "$tmp/rustup-init" -y --quiet --profile minimal --default-toolchain stable || { rm -rf "$tmp"; return 1; }
      rm -rf "$tmp"
      . "$HOME/.cargo/env"
    fi
    ncclean_rust_ok || { echo "error: Rust was installed but cargo 1.89+ is still not on PATH" >&2; return 1; }
  fi
  if ! command -v cc >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "no C linker (cc): installing gcc and libc6-dev with apt-get" >&2
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev; } >/dev/null || return 1
    else
      echo "error: Rust links through a C compiler, and this machine has no \`cc\`." >&2
      echo "  Install one (Debian/Ubuntu: sudo apt-get install build-essential; macOS: xcode-select --install)." >&2
      return 1
    fi
  fi
}

ncclean_ensure_rust
