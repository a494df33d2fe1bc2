"""Arm runners: one per engine or peer (``python -m harness run-vllm``, ``run-llamacpp``, ``run-openvino``).

Each prints one JSON object (metrics and provenance) as its last stdout line; ``grid`` runs them.
"""
