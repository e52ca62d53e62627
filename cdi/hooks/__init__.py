"""createContainer hooks, safe by construction (docs/developer/hook-safety.md); how a spec
invokes them: :mod:`cdi.hooks.entry`; the command line: :mod:`cdi.hooks.cli`."""
