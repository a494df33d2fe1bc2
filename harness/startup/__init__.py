"""Start-up profiles (issue 32): ``python -m harness startup`` (:mod:`harness.startup.run`), the phases
from time-stamped log lines (:mod:`harness.startup.phases`) and the profiled ``vllm.LLM`` script
(:mod:`harness.startup.child`)."""
