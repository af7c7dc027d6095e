# Sourced by the tests that need Hugging Face's tokenizers and transformers (t_16, t_36):
# tokenizers_python LOG sets $python to TOKENIZERS_PYTHON, python3 when it has the packages, else
# a venv of the pinned versions in build/ (made once, when pip can reach its index; pip's output
# goes to LOG). The caller then tests `$python -c "import tokenizers, transformers"` and skips
# what needs them when that fails.
tokenizers_python() {
    python=${TOKENIZERS_PYTHON:-python3}
    local venv=${PICOTRON_BUILD:-build}/tokenizers-venv
    if ! $python -c "import tokenizers, transformers" 2>/dev/null && [ -z "${TOKENIZERS_PYTHON:-}" ]; then
        if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import tokenizers, transformers" 2>/dev/null; then
            rm -rf "$venv"
            { python3 -m venv "$venv" &&
              timeout 300 "$venv/bin/pip" install -q tokenizers==0.23.3 transformers==5.24.0; } \
                >"$1" 2>&1 || rm -rf "$venv"
        fi
        [ -x "$venv/bin/python" ] && python=$venv/bin/python
    fi
}
