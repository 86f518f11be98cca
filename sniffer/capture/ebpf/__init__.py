"""eBPF syscall-level capture: see ``loader.py`` (API) and ``sparseety.bpf.c`` (kernel side)."""

from sniffer.capture.ebpf.loader import EbpfError, EbpfSource, default_obj_path

__all__ = ["EbpfError", "EbpfSource", "default_obj_path"]
