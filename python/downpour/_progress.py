"""wait()'s progress: one line rewritten in place on a terminal or in a
notebook, else a line per step reached (as downpourctl wait prints them)."""
import sys
import time

_WIDTH = 24


def _short(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class ProgressBar:
    def __init__(self, job_id, stream=None):
        self.job_id = job_id
        self.stream = stream if stream is not None else sys.stderr
        # A notebook's output area honours \r as a terminal does.
        interactive = getattr(self.stream, "isatty", lambda: False)()
        self.in_place = interactive or "ipykernel" in sys.modules
        self.first = None  # (time, step) of the first RUNNING report seen.
        self.printed = None  # (state, step) last shown.
        self.width = 0

    def _eta(self, step, steps):
        now = time.monotonic()
        if self.first is None:
            self.first = (now, step)
            return "?"
        seconds, done = now - self.first[0], step - self.first[1]
        if seconds <= 0 or done <= 0:
            return "?"
        return _short(max(0, steps - step) * seconds / done)

    def _show(self, text, final=False):
        if self.in_place:
            pad = " " * max(0, self.width - len(text))
            self.stream.write("\r" + text + pad + ("\n" if final else ""))
            self.width = 0 if final else len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def update(self, job, state_name):
        if (state_name, job.step) == self.printed:
            return
        self.printed = (state_name, job.step)
        text = f"job {job.id} {state_name}"
        if state_name == "RUNNING":
            steps = job.spec.steps
            done = min(1.0, job.step / steps) if steps > 0 else 0.0
            filled = int(done * _WIDTH)
            text += (f" [{'#' * filled}{'.' * (_WIDTH - filled)}] {job.step}/{steps}"
                     f" loss {job.loss:.3f} {job.examples_per_sec:.0f} ex/s"
                     f" ETA {self._eta(job.step, steps)}")
        elif job.message:
            text += ": " + job.message
        self._show(text)

    def note(self, text):
        """A line of its own (reconnecting, reconnected)."""
        if self.in_place and self.width:
            self.stream.write("\n")
            self.width = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, text):
        self._show(text, final=True)
