# Sourced by the GPU scripts: install the carried wheels (.whl/, git-ignored: nvmath-python, which
# the device image lacks) into /tmp/site and put it on PYTHONPATH.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
