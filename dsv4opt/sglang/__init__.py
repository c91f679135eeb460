"""dsv4opt's kernels inside SGLang's own server: drop-ins for SGLang functions, the SGLang plugin that
installs them in every SGLang process, and the launcher (`python -m dsv4opt.sglang.launch`)."""
