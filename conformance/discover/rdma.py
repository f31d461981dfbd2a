"""A node's RDMA ports (InfiniBand, RoCE) as the kernel shows them, and what is wrong with them.

The kernel's files (Documentation/ABI/stable/sysfs-class-infiniband; drivers/infiniband/core/sysfs.c
writes them): ``/sys/class/infiniband/<device>/ports/<port>/state`` (``4: ACTIVE``; DOWN, INIT,
ARMED, ACTIVE, ACTIVE_DEFER), ``phys_state`` (``5: LinkUp``; Sleep, Polling, Disabled, ...),
``rate`` (``200 Gb/sec (4X HDR)``: active width times active speed), ``link_layer``
(``InfiniBand`` or ``Ethernet``: RoCE), ``gid_attrs/types/<index>`` (``RoCE v2``, ``IB/RoCE v1``)
and ``gids/<index>``; ``<device>/device`` links to its PCI function.  GPUDirect RDMA needs the
``nvidia_peermem`` module (``/sys/module/nvidia_peermem``) unless NCCL uses dma-buf (NCCL 2.19+
on a 5.12+ kernel with NVIDIA's open kernel modules: NCCL's ``NCCL_DMABUF_ENABLE``).

What is wrong, judged per link layer (an InfiniBand fabric and a RoCE one are not siblings):
* a port whose link is up but whose state is not ACTIVE (INIT: no subnet manager answered);
* a device whose every port is down while another device of the same link layer is ACTIVE: GPU
  servers give each GPU its own NIC, so one NIC down among its active siblings is a cable, optic
  or switch port (a second port of an active device is often left uncabled: not judged);
* an ACTIVE port below the highest rate of its active siblings (a link trained at half its
  width or speed, the RoCE port at 100 of 200 Gb/s).
A port ``NCCL_IB_HCA`` names is judged whatever its siblings do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from conformance.common.inputs import read_bounded

SYS_CLASS = Path("/sys/class/infiniband")
PEERMEM = Path("/sys/module/nvidia_peermem")
ACTIVE, LINK_UP = "ACTIVE", "LinkUp"
SMALL_FILE = 4096
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class RdmaPort:
    device: str  # mlx5_0
    port: int
    state: str  # ACTIVE, DOWN, INIT, ...
    phys_state: str  # LinkUp, Polling, Disabled, ...
    rate_gbps: float | None  # None: not read
    link_layer: str  # InfiniBand, Ethernet
    pci: str = ""  # the device's PCI function (0000:18:00.0), "" unknown
    roce_v2_gids: tuple[int, ...] = ()  # GID indexes of type RoCE v2 with an address (Ethernet only)

    @property
    def name(self) -> str:
        return f"{self.device} port {self.port}"

    def text(self) -> str:
        rate = f"{self.rate_gbps:g} Gb/s" if self.rate_gbps is not None else "rate unknown"
        return f"{self.name} ({self.link_layer}, {self.state}/{self.phys_state}, {rate})"


@dataclass(frozen=True)
class RdmaFacts:
    ports: tuple[RdmaPort, ...] = ()
    peermem: bool | None = None  # nvidia_peermem loaded; None: not read
    unread: str = ""  # why the ports could not be read ("" when they were, or there are none)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def rdma_from_json(data: object) -> RdmaFacts:
    """The facts a topology file or run.json holds; a port of the wrong shape is left out, never guessed."""
    if not isinstance(data, Mapping):
        return RdmaFacts()
    ports = tuple(port for p in data.get("ports") or () if (port := _port(p)) is not None)
    peermem = data.get("peermem")
    return RdmaFacts(ports, peermem if isinstance(peermem, bool) else None, str(data.get("unread") or ""))


def _port(data: object) -> RdmaPort | None:
    if not isinstance(data, Mapping):
        return None
    known = {k: v for k, v in data.items() if k in RdmaPort.__dataclass_fields__}
    try:
        port = RdmaPort(**{**known, "roce_v2_gids": tuple(known.get("roce_v2_gids") or ())})
    except TypeError:  # a required field missing
        return None
    rate_ok = port.rate_gbps is None or isinstance(port.rate_gbps, (int, float))
    return port if isinstance(port.device, str) and isinstance(port.port, int) and rate_ok else None


def _text(path: Path) -> str:
    try:
        return read_bounded(path, SMALL_FILE).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _word(text: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE`` (sysfs.c prints the number, a colon, the name)."""
    return text.split(":", 1)[1].strip() if ":" in text else text


def _rate(text: str) -> float | None:
    found = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text)
    return float(found[1]) if found else None


def _roce_v2_gids(port: Path) -> tuple[int, ...]:
    found = []
    types = port / "gid_attrs" / "types"
    for entry in (
        sorted(types.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1) if types.is_dir() else ()
    ):
        if (
            entry.name.isdigit()
            and _text(entry) == "RoCE v2"
            and _text(port / "gids" / entry.name) not in ("", ZERO_GID)
        ):
            found.append(int(entry.name))
    return tuple(found)


def read_port(device: Path, port: Path) -> RdmaPort:
    layer = _text(port / "link_layer") or "InfiniBand"
    pci = device.joinpath("device").resolve().name if device.joinpath("device").exists() else ""
    return RdmaPort(
        device=device.name,
        port=int(port.name),
        state=_word(_text(port / "state")),
        phys_state=_word(_text(port / "phys_state")),
        rate_gbps=_rate(_text(port / "rate")),
        link_layer=layer,
        pci=pci,
        roce_v2_gids=_roce_v2_gids(port) if layer == "Ethernet" else (),
    )


def read_rdma(sys_class: Path = SYS_CLASS, peermem: Path = PEERMEM) -> RdmaFacts:
    """Every RDMA port of this node (none: no RDMA device, or no /sys/class/infiniband)."""
    if not sys_class.is_dir():
        return RdmaFacts()
    try:
        ports = tuple(
            read_port(device, port)
            for device in sorted(sys_class.iterdir())
            for port in sorted((device / "ports").iterdir(), key=lambda p: p.name)
            if port.name.isdigit()
        )
    except OSError as exc:
        return RdmaFacts(unread=f"{sys_class}: {exc.strerror or exc}")
    return RdmaFacts(ports, peermem.exists())


def hca_names(environ: Mapping[str, str]) -> set[str] | None:
    """The devices ``NCCL_IB_HCA`` asks for by name (``mlx5_0:1,mlx5_1``; ``=`` exact); None: unset or an exclusion."""
    value = environ.get("NCCL_IB_HCA", "").strip()
    if not value or value.startswith("^"):
        return None
    return {part.split(":", 1)[0] for part in value.lstrip("=").split(",") if part}


def port_problems(facts: RdmaFacts, environ: Mapping[str, str]) -> list[str]:
    """What is wrong with the ports, one line each naming the port (module doc)."""
    wanted = hca_names(environ)
    problems = []
    for layer in sorted({p.link_layer for p in facts.ports}):
        ports = [p for p in facts.ports if p.link_layer == layer]
        active = [p for p in ports if p.state == ACTIVE]
        top = max((p.rate_gbps for p in active if p.rate_gbps is not None), default=None)
        active_devices = {p.device for p in active}
        for port in ports:
            named = wanted is not None and port.device in wanted
            if port.phys_state == LINK_UP and port.state != ACTIVE:
                problems.append(f"{port.text()}: the link is up but the port is not ACTIVE (no subnet manager?)")
            elif port.state != ACTIVE and (named or (active and port.device not in active_devices)):
                why = "NCCL_IB_HCA names it" if named else f"{len(active_devices)} other {layer} device(s) are ACTIVE"
                problems.append(f"{port.text()}: down while {why}: check its cable, optic and switch port")
            elif port.state == ACTIVE and top is not None and port.rate_gbps is not None and port.rate_gbps < top:
                problems.append(
                    f"{port.text()}: below its siblings' {top:g} Gb/s: the link trained narrower or slower "
                    "(reseat the cable or optic, check the switch port's speed)"
                )
    return problems


def rdma_warnings(facts: RdmaFacts, gpus: int) -> list[str]:
    """What slows GPU traffic over the ports without failing it: no GPUDirect RDMA, no RoCE v2 GID."""
    warnings = []
    if gpus and facts.peermem is False and any(p.state == ACTIVE for p in facts.ports):
        warnings.append(
            "nvidia_peermem is not loaded: NCCL reaches GPU memory over RDMA only through dma-buf (NCCL 2.19+, "
            "kernel 5.12+, NVIDIA's open kernel modules), else it stages through host memory (`modprobe "
            "nvidia_peermem`)"
        )
    for port in facts.ports:
        if port.link_layer == "Ethernet" and port.state == ACTIVE and not port.roce_v2_gids:
            warnings.append(f"{port.name}: RoCE without a RoCE v2 GID: set one up, or NCCL_IB_GID_INDEX by hand")
    return warnings


# -- the NICs as NCCL's topology sees them (``plan/net_path.py`` applies its rule) -----------------

PATH_CLASSES = ("PIX", "PXB", "PHB", "SYS")


@dataclass(frozen=True)
class Nic:
    """An RDMA device NCCL may use (one with an ACTIVE port), and how far it is from each GPU."""

    device: str  # mlx5_0
    pci: str  # 0000:18:00.0
    rate_gbps: float  # its fastest ACTIVE port's rate
    pcie_gen: int | None = None  # the link's maximum generation (the lower of the device's and its port's)
    pcie_width: int | None = None
    paths: Mapping[str, str] = field(default_factory=dict)  # GPU name -> PIX, PXB, PHB or SYS

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def nics_from_json(data: object) -> tuple[Nic, ...]:
    """A topology file's ``nics``; an entry of the wrong shape is left out."""
    found = []
    for entry in data if isinstance(data, list) else ():
        if not isinstance(entry, Mapping):
            continue
        try:
            nic = Nic(**{k: v for k, v in entry.items() if k in Nic.__dataclass_fields__})
        except TypeError:
            continue
        if isinstance(nic.device, str) and isinstance(nic.rate_gbps, (int, float)) and isinstance(nic.paths, Mapping):
            found.append(nic)
    return tuple(found)


def pci_path_class(gpu: Path, nic: Path) -> str:
    """The PCIe path between two functions from their sysfs paths (``/sys/devices/pci0000:00/.../0000:18:00.0``).

    NCCL's classes (src/graph/paths.cc): PIX through at most one PCIe switch, PXB through several, PHB
    through a host bridge, SYS across host bridges (NCCL's PHB and SYS; nvidia-smi's NODE is PHB, its
    SYS across NUMA nodes).  A switch shows in sysfs as an upstream port above its downstream ports.
    """
    a, b = gpu.resolve().parts, nic.resolve().parts
    roots = [i for i, part in enumerate(a) if part.startswith("pci")]
    if not roots or len(b) <= roots[0] or a[: roots[0] + 1] != b[: roots[0] + 1]:  # another host bridge
        same_node = _text(gpu / "numa_node") == _text(nic / "numa_node") and _text(gpu / "numa_node") != ""
        return "PHB" if same_node else "SYS"
    common = 0
    while common < min(len(a), len(b)) - 1 and a[common] == b[common]:
        common += 1
    bridges = common - roots[0] - 1  # bridges both share below the host bridge: root port, switch ports
    if bridges <= 0:
        return "PHB"
    below = max(len(a), len(b)) - common - 1  # ports below the shared one, down to the farther device
    return "PIX" if below <= 1 and bridges >= 2 else "PXB"


def _pcie_max(function: Path) -> tuple[int | None, int | None]:
    """The lower of the device's and its upstream port's maximum speed and width (NCCL's xml.cc reads both)."""
    gens, widths = [], []
    for folder in (function, function.resolve().parent):
        speed = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", _text(folder / "max_link_speed"))
        if speed:
            gens.append(GEN_OF_SPEED.get(speed[1].rstrip("0").rstrip("."), 3))
        width = _text(folder / "max_link_width")
        if width.isdigit():
            widths.append(int(width))
    return (min(gens) if gens else None), (min(widths) if widths else None)


GEN_OF_SPEED = {"2.5": 1, "5": 2, "8": 3, "16": 4, "32": 5, "64": 6}  # GT/s per lane -> PCIe generation


def read_nics(facts: RdmaFacts, gpu_functions: Mapping[str, str], pci_devices: Path) -> tuple[Nic, ...]:
    """Each device with an ACTIVE port (NCCL keeps only those: net_ib.cc ``ncclIbInit``), its link and GPU paths."""
    nics = []
    for device in sorted({p.device for p in facts.ports if p.state == ACTIVE}):
        ports = [p for p in facts.ports if p.device == device and p.state == ACTIVE]
        pci = next((p.pci for p in ports if p.pci), "")
        if not pci or not (pci_devices / pci).exists():
            continue
        function = pci_devices / pci
        gen, width = _pcie_max(function)
        paths = {
            gpu: pci_path_class(pci_devices / bus, function)
            for gpu, bus in gpu_functions.items()
            if (pci_devices / bus).exists()
        }
        rate = max((p.rate_gbps or 0.0) for p in ports)
        nics.append(Nic(device, pci, rate, gen, width, paths))
    return tuple(nics)
