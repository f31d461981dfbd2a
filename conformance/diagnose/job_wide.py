"""The job as a whole: processes to ranks, and what only all of them together show.

:func:`ranked_stories` gives each process its global rank (its own prefix, its NCCL init line by
host and pid, its node and local rank).  :func:`job_cause` is for when no single rank stands out:
mixed NCCL versions, a rendezvous that timed out, a rank given to two processes or never started,
an interface the nodes cannot share, collectives out of step (by sequence number, operation and
size), a stuck watchdog, an unpinned barrier, a transport hang.  :func:`launch_notes` says which
ranks and nodes the logs never show, against the size the job states.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from conformance.common.casefiles import RankStatus
from conformance.common.versions import release
from conformance.diagnose.death_reading import stopped
from conformance.diagnose.evidence import JobEvidence
from conformance.diagnose.findings import Finding
from conformance.diagnose.logs import LogLine, Who
from conformance.diagnose.stories import Collective, ProcessStory, node_of
from conformance.verdict import job_causes
from conformance.verdict.job_causes import FailureClass
from conformance.verdict.nccl_facts import NcclLog
from conformance.verdict.nccl_transport import NET_IB, NET_SOCKET, P2P_CUMEM, P2P_DIRECT, P2P_IPC, SHM, classify

EVIDENCE_LINES = 6  # quoted in the answer
GPU_TRANSPORTS = (P2P_CUMEM, P2P_IPC, P2P_DIRECT, SHM, NET_IB, NET_SOCKET)
RANK_LIST_LIMIT = 1 << 16  # a stated world size beyond this is not checked rank by rank

Stories = dict[int | str, ProcessStory]


def compact(ranks: list[str]) -> str:
    """``0-3,5`` for the numbers among ``ranks``, the rest as they are."""
    numbers = sorted({int(r) for r in ranks if r.isdigit()})
    spans: list[str] = []
    for number in numbers:
        if spans and spans[-1].split("-")[-1] == str(number - 1):
            spans[-1] = f"{spans[-1].split('-')[0]}-{number}"
        else:
            spans.append(str(number))
    return ",".join(spans + [r for r in ranks if not r.isdigit()])


def ranks_text(keys: list[int | str]) -> list[str]:
    return [str(key) for key in sorted(keys, key=lambda k: (isinstance(k, str), str(k).zfill(8)))]


# --------------------------------------------------------------------------------------------
# Processes to ranks
# --------------------------------------------------------------------------------------------


def _rank_of(
    story: ProcessStory, pid_ranks: dict[tuple[str, int], int], nproc: int, nodes: list[str], per_node: bool
) -> int | None:
    """A process's global rank; srun's task only where srun started the ranks (``per_node``: torchrun did, per node)."""
    who = story.who
    if who.rank is not None:
        return who.rank
    if who.host is not None and who.pid is not None and (who.host, who.pid) in pid_ranks:
        return pid_ranks[(who.host, who.pid)]
    if who.local_rank is not None:
        node = node_of(who)
        return nodes.index(node) * nproc + who.local_rank if node in nodes else who.local_rank
    return None if per_node else who.task


def _pid_ranks(nccl: NcclLog) -> dict[tuple[str, int], int]:
    """Each NCCL process's rank in its largest communicator (the world), from its init lines."""
    best: dict[tuple[str, int], tuple[int, int]] = {}
    for init in nccl.inits.values():
        if init.host is None or init.pid is None or init.rank is None:
            continue
        size = init.nranks or 0
        if size >= best.get((init.host, init.pid), (-1, 0))[0]:
            best[(init.host, init.pid)] = (size, init.rank)
    return {process: rank for process, (_, rank) in best.items()}


def _node_order(node: str) -> tuple[int, str]:
    return (int(node), "") if node.isdigit() else (1 << 30, node)


def ranked_stories(evidence: JobEvidence, nccl: NcclLog) -> Stories:
    """The processes by rank (a process whose rank the logs never say: by its file), stories of one rank merged."""
    pid_ranks = _pid_ranks(nccl)
    nproc = max((local for _, local in evidence.local_ranks), default=0) + 1
    nodes = sorted({node for node, _ in evidence.local_ranks}, key=_node_order)
    nodes = nodes if len(nodes) > 1 else []
    ranked: Stories = {}
    per_node = bool(evidence.local_ranks)  # torchrun's local ranks seen: an srun task is a node's torchrun
    for story in evidence.stories.values():
        rank = _rank_of(story, pid_ranks, nproc, nodes, per_node)
        key: int | str = rank if rank is not None else " ".join(story.key) if story.key[0] == "task" else story.key[1]
        if key in ranked:
            ranked[key].absorb(story)
        else:
            ranked[key] = story
    return ranked


def label(key: int | str, story: ProcessStory) -> str:
    host = f" (node {story.who.host})" if story.who.host and story.who.host not in str(key) else ""
    if isinstance(key, int):
        return f"rank {key}{host}"
    if story.key[0] == "task":
        return f"srun {key}{host}"
    return f"process {key}{host}" if story.key[0] == "pid" else f"the process writing {key}{host}"


# --------------------------------------------------------------------------------------------
# The job's size: ranks never seen, ranks seen twice
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """The job's stated size against the ranks its logs show."""

    size: int | None
    size_line: LogLine | None
    seen: set[int]
    missing: list[int]
    twice: list[int]  # ranks that more than one process announced
    joined: tuple[int, int, LogLine] | None


def launch(evidence: JobEvidence, nccl: NcclLog, stories: Stories) -> Launch:
    facts = evidence.facts
    world = max((init.nranks or 0 for init in nccl.inits.values()), default=0)
    sizes = dict(facts.sizes)
    if world:
        sizes.setdefault(world, LogLine("", 0, f"NCCL communicator of {world} ranks", Who()))
    size = max(sizes, default=None)
    seen = {key for key in stories if isinstance(key, int)} | facts.ranks_written | set(facts.members)
    seen |= {init.rank for init in nccl.inits.values() if init.rank is not None and init.nranks == size}
    twice = _announced_twice(facts.members, size) | _claimed_twice(nccl)
    missing: list[int] = []
    if size is not None and 1 < size <= RANK_LIST_LIMIT and seen:
        missing = [rank for rank in range(size) if rank not in seen]
    return Launch(size, sizes.get(size) if size else None, seen, missing, sorted(twice), facts.joined)


def _announced_twice(members: dict[int, int], size: int | None) -> set[int]:
    """Ranks that announced themselves more often than others did (a rank of the job never seen: 0 times).

    Every rank twice is a restart, not a duplicate; ranks 0-3 twice while ranks 4-7 never is two nodes
    started as the same node.
    """
    if not members:
        return set()
    everyone = range(size) if size is not None and size <= RANK_LIST_LIMIT else members
    usual = min(members.get(rank, 0) for rank in everyone)
    return {rank for rank, times in members.items() if times > max(usual, 1)}


def _claimed_twice(nccl: NcclLog) -> set[int]:
    """Ranks that two processes claimed in one communicator (NCCL's init lines: the same commId, the same rank)."""
    claims: dict[tuple[str, int], set[tuple[str | None, int | None]]] = {}
    for init in nccl.inits.values():
        if init.comm_id is not None and init.rank is not None and init.pid is not None:
            claims.setdefault((init.comm_id, init.rank), set()).add((init.host, init.pid))
    return {rank for (_, rank), processes in claims.items() if len(processes) > 1}


def launch_notes(found: Launch, hosts: set[str], nnodes: int | None) -> list[str]:
    """What the answer says of the job's size: ranks never seen, ranks announced twice, nodes missing."""
    notes: list[str] = []
    if found.size is not None and found.missing and len(found.missing) < found.size:
        where = f" ({found.size_line.where})" if found.size_line and found.size_line.number else ""
        notes.append(
            f"ranks {compact([str(r) for r in found.missing])} of the {found.size} the job states{where} never "
            "appear in these logs: read their node's log (or give every rank's output)"
        )
    if found.twice:
        notes.append(
            f"ranks {compact([str(r) for r in found.twice])} were announced by more than one process: two nodes or "
            "tasks were given the same node rank or rank (check --node-rank / SLURM_NODEID per node)"
        )
    if nnodes is not None and 1 < nnodes and 0 < len(hosts) < nnodes:
        notes.append(f"the job states {nnodes} nodes; these logs show {len(hosts)}: {', '.join(sorted(hosts)[:8])}")
    return notes


def _launch_mismatch(found: Launch) -> Finding | None:
    """A rank given to two processes, or fewer processes than the world size at the store: the launch is wrong."""
    failure = job_causes.RENDEZVOUS
    if found.twice:
        title = f"{failure.title}: rank {compact([str(r) for r in found.twice])} given to more than one process"
        return Finding(failure, title, failure.fix, (), RankStatus.ERROR, tuple(found.twice), decisive=True)
    if found.joined is not None and found.joined[0] < found.joined[1]:
        joined, size, line = found.joined
        title = f"{failure.title}: only {joined} of {size} processes reached the store"
        return Finding(failure, title, failure.fix, (line,), RankStatus.ERROR, decisive=True)
    return None


# --------------------------------------------------------------------------------------------
# What all the ranks together show
# --------------------------------------------------------------------------------------------


def all_signs(stories: Stories, failure: FailureClass) -> list[tuple[int | str, LogLine]]:
    return [(key, line) for key, s in stories.items() for _, line in s.signs.get(failure.key, [])]


def _job_finding(
    failure: FailureClass, lines: list[LogLine], title: str = "", ranks: tuple[int | str, ...] = ()
) -> Finding:
    lines_kept = tuple(lines[:EVIDENCE_LINES])
    decisive = failure is job_causes.VERSION_MISMATCH  # processes that disagree on NCCL: nothing else matters first
    return Finding(failure, title or failure.title, failure.fix, lines_kept, RankStatus.ERROR, ranks, decisive=decisive)


def transports(evidence: JobEvidence, nccl: NcclLog) -> list[str]:
    """The GPU transports NCCL's connection lines name (P2P_IPC, SHM, NET_IB, ...)."""
    used = {classify(via)[0] for via in evidence.facts.vias}
    used |= {c.transport for c in nccl.connections}
    return sorted(t for t in used if t in GPU_TRANSPORTS)


def _versions(evidence: JobEvidence, nccl: NcclLog, stories: Stories) -> Finding | None:
    """NCCL versions or network plugins that differ between processes, or an NCCL older than the GPU it runs on."""
    failure = job_causes.VERSION_MISMATCH
    mismatch = all_signs(stories, failure)
    if len(nccl.versions) > 1:
        return _job_finding(
            failure, [line for _, line in mismatch], f"NCCL VERSIONS DIFFER: {', '.join(nccl.versions)}"
        )
    plugins = evidence.facts.net_plugins
    if len({name for name, _ in plugins.values()}) > 1:
        each = ", ".join(f"{host}: {name}" for host, (name, _) in sorted(plugins.items())[:6])
        title = f"NCCL NETWORK PLUGINS DIFFER BETWEEN NODES ({each})"
        return _job_finding(failure, [line for _, line in plugins.values()], title)
    if mismatch:
        return _job_finding(failure, [line for _, line in mismatch])
    gpu = evidence.facts.gpu
    if gpu is not None and nccl.version and (release(nccl.version) or ()) < (release(gpu[0].nccl) or ()):
        generation = gpu[0]
        title = (
            f"NCCL {nccl.version} IS OLDER THAN {generation.name.upper()} (sm_{generation.sm}) NEEDS: {generation.nccl}"
        )
        fix = f"upgrade NCCL to {generation.nccl} or later ({generation.source}); {failure.fix}"
        return Finding(failure, title, fix, (gpu[1],), RankStatus.ERROR, decisive=True)
    return None


def _named_by_lines(stories: Stories) -> Finding | None:
    for failure in (job_causes.RENDEZVOUS, job_causes.NETWORK_INTERFACE):
        signs = all_signs(stories, failure)
        if signs:
            return _job_finding(failure, [line for _, line in signs])
    return None


def _unreachable_interface(evidence: JobEvidence, nccl: NcclLog, victims: list[int | str]) -> Finding | None:
    """NCCL bootstrapping over an interface no other node reaches (docker0, lo), in a job of several nodes."""
    unreachable = [i for i in nccl.bootstrap_interfaces if job_causes.UNREACHABLE_INTERFACES.match(i)]
    if unreachable and len(evidence.facts.hosts) > 1 and victims:
        title = f"{job_causes.NETWORK_INTERFACE.title}: NCCL bootstraps over {', '.join(unreachable)}"
        return _job_finding(job_causes.NETWORK_INTERFACE, [], title)
    return None


def _waiting_on(stories: Stories, victims: list[int | str]) -> Finding | None:
    """A stuck watchdog or an unpinned barrier, where ranks waited."""
    for failure in (job_causes.WATCHDOG_STUCK, job_causes.BARRIER_DEVICE):
        signs = all_signs(stories, failure)
        if signs and victims:
            return _job_finding(failure, [line for _, line in signs])
    return None


def _hang(evidence: JobEvidence, nccl: NcclLog) -> Finding:
    used = transports(evidence, nccl)
    if used or nccl.incomplete_inits:
        title = (
            f"HANG IN NCCL's TRANSPORT ({', '.join(used) or 'none connected'}; "
            f"{len(nccl.incomplete_inits)} communicator inits never completed)"
        )
        return _job_finding(job_causes.TRANSPORT, [], title)
    return _job_finding(job_causes.HANG, [])


def job_cause(evidence: JobEvidence, nccl: NcclLog, stories: Stories, victims: list[int | str]) -> Finding | None:
    """What the job as a whole shows, for when no single rank stands out (or versions disagree)."""
    found = (
        _versions(evidence, nccl, stories)
        or _launch_mismatch(launch(evidence, nccl, stories))
        or _named_by_lines(stories)
        or _unreachable_interface(evidence, nccl, victims)
        or desync(stories)
        or _waiting_on(stories, victims)
    )
    if found is not None or not victims:
        return found
    return _stopped(evidence, stories, victims) or _hang(evidence, nccl)


def _stopped(evidence: JobEvidence, stories: Stories, victims: list[int | str]) -> Finding | None:
    """The job stopped from outside (a scheduler's time limit, preemption, a cancel, SIGTERM), no rank having waited.

    A rank that timed out or lost its peer before is a hang's victim: the stop only ended it.  A Ctrl-C (SIGINT,
    KeyboardInterrupt) is a user stopping what looked stuck: a hang's, too.
    """
    if any(not job_causes.STOPPED_FROM_OUTSIDE.search(line.text) for k in victims for line in stories[k].victim_lines):
        return None
    terms = [pair for key in victims for pair in stories[key].deaths if pair[0].signal in (15, 1)]
    reading = stopped(evidence.facts.stop, terms)
    if reading is None:
        return None
    return Finding(reading.failure, reading.title, reading.fix, reading.lines, RankStatus.ERROR)


def _describe(collective: Collective) -> str:
    size = f", {collective.numel} elements" if collective.numel is not None else ""
    return f"SeqNum {collective.seq} {collective.op or '?'}{size}"


def desync(stories: Stories) -> Finding | None:
    """Ranks whose watchdog timed out in different collectives (number, operation or size): another code path.

    The ranks alone in their collective are the root; when no collective is the most common one (two ranks,
    one in each), every rank's is named and none is blamed.
    """
    last = {key: s.collective for key, s in stories.items() if s.collective is not None}
    shapes = Counter(c.shape for c in last.values())
    if len(shapes) < 2:
        return None
    (common, most), *rest = shapes.most_common()
    failure = job_causes.DESYNC
    if rest and rest[0][1] == most:  # no majority: say what each was in
        each = "; ".join(f"rank {key}: {_describe(c)}" for key, c in sorted(last.items(), key=lambda kv: str(kv[0])))
        lines = [c.line for c in last.values()]
        return _job_finding(failure, lines, f"{failure.title}: the ranks were in different collectives ({each[:300]})")
    odd = [key for key, c in last.items() if c.shape != common]
    usual = next(c for c in last.values() if c.shape == common)
    title = (
        f"{failure.title}: rank{'s' * (len(odd) > 1)} {', '.join(ranks_text(odd))} timed out in "
        f"{_describe(last[odd[0]])}, the other ranks in {_describe(usual)}"
    )
    return _job_finding(failure, [last[key].line for key in odd] + [usual.line], title, tuple(odd))
