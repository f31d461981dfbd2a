"""The lines of a job that report deaths, memory kills, a scheduler's stop and native crashes, kept for the evidence.

Each death is kept in the story of the process its line names (srun's task, mpirun's rank, torchrun's
local rank and pid), not of the launcher that printed it; a line that names none is about the process
whose output it is (a shell's "Killed").  Two-line reports (PRRTE's "exited on" / "signal 9", Open MPI's
"Process name:" / "Exit code:") are joined first.  Every list is bounded (``stories.KEPT_PER_KIND``,
``FACTS_KEPT``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from conformance.diagnose.deaths import (
    CONTINUED,
    CRASH_SAYS,
    SLURM_OOM,
    Death,
    MemoryKill,
    death_in,
    memory_kill_in,
    signal_of,
    stop_in,
)
from conformance.diagnose.logs import LogLine, Who
from conformance.diagnose.stories import FACTS_KEPT, KEPT_PER_KIND, JobFacts, ProcessStory

StoryOf = Callable[[Who, str], ProcessStory]


@dataclass
class DeathLines:
    """Reads one line at a time (:meth:`read`) into the job's facts and the stories of the processes named."""

    facts: JobFacts
    story_of: StoryOf
    continued: LogLine | None = None  # the first line of a two-line report, waiting for its second
    reported: LogLine | None = None  # the last line read that reported a death

    def end_file(self) -> None:
        self.continued = None

    def read(self, story: ProcessStory, line: LogLine) -> bool:
        """Whether the line reports a death (kept in the story of the process it names)."""
        read = line
        line = self._joined(line)
        text = line.text
        self._facts(story, line, text)
        death = death_in(text) or self._memory_death(text)
        if death is None:
            return False
        self._keep(story, death, line)
        self.reported = read
        return True

    def exit_code(self, story: ProcessStory, code: int, pid: int, line: LogLine) -> None:
        """A death in torchrun's failure table ("exitcode : -9 (pid: 1234)"), of the process its block is about."""
        signal, status, shell = signal_of({"code": str(code)})
        self._keep(story, Death("torchrun", signal, status, pid=pid or None, through_shell=shell), line)
        self.reported = line

    def _joined(self, line: LogLine) -> LogLine:
        """The line, or the report it ends joined with its first line (quoted where that one is)."""
        before, self.continued = self.continued, line if CONTINUED.search(line.text) else None
        if before is not None and before.path == line.path and before.number + 1 == line.number:
            return replace(before, text=f"{before.text.rstrip()} {line.text.strip()}")
        return line

    def _facts(self, story: ProcessStory, line: LogLine, text: str) -> None:
        facts = self.facts
        if (kill := memory_kill_in(text)) is not None and len(facts.memory_kills) < FACTS_KEPT:
            facts.memory_kills.append((kill, line))
        if facts.stop is None and (stop := stop_in(text)) is not None:
            facts.stop = (stop, line)
        if CRASH_SAYS.search(text):
            facts.add_kept(facts.crash_lines, line)
            if len(story.crash_lines) < KEPT_PER_KIND:
                story.crash_lines.append(line)

    @staticmethod
    def _memory_death(text: str) -> Death | None:
        """A memory killer's line as a death (SIGKILL) of the process whose output it is."""
        kill = memory_kill_in(text)
        return None if kill is None else Death(kill.reporter, 9, oom=True)

    def _target(self, story: ProcessStory, death: Death, line: LogLine) -> ProcessStory:
        """The story of the process a death's line names; the line's own where it names none."""
        if not death.names_process:
            return story
        who = death.who
        if death.rank is None:  # a local rank, task or pid: on the node the line came from
            who = who.merged(Who(task=line.who.task, host=line.who.host))
            if death.local_rank is None and death.task is None:  # a pid only: torchrun's block says whose
                who = who.merged(line.who)
        return self.story_of(who, line.path)

    def _keep(self, story: ProcessStory, death: Death, line: LogLine) -> None:
        target = self._target(story, death, line)
        if len(target.deaths) < KEPT_PER_KIND:
            target.deaths.append((death, line))
        if target.first_time is None:
            target.first_time = story.clock
        if death.oom and death.launcher == "srun" and len(self.facts.memory_kills) < FACTS_KEPT:
            self.facts.memory_kills.append((MemoryKill("srun", SLURM_OOM, death.pid), line))
