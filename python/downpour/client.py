"""downpour.Client: what downpourctl does, from Python, over the
Coordinator service (proto/coordinator_service.proto).

Every call has a deadline (`timeout`, or `long_timeout` for the calls that
move a model: a submit with initial weights or an ONNX model, resume,
export) and raises DownpourError with one sentence, the coordinator's own
message where it answered. A Client holds one gRPC channel; it is safe to
share between threads (gRPC's channels are), and closes with close() or
a `with` block.
"""
import collections
import os
import re
import time

import grpc
from google.protobuf import json_format, text_format

from . import _config, _safetensors
from ._progress import ProgressBar
from .errors import DownpourError
from .proto import coordinator_pb2, coordinator_service_pb2_grpc, job_pb2

_WATCH_POLL_S = 10.0  # Server-side long poll of WatchJob and JobLogs.
_WATCH_GRACE_S = 5.0  # A long poll's deadline: its poll plus this.
_MAX_MESSAGE = 256 << 20  # A long job history makes ListJobs answers large.
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_TERMINAL = (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.STOPPED)


class LogLine(collections.namedtuple("LogLine", "time_ms source text sequence")):
    """One line a node or the coordinator logged about a job; str() prints
    it as downpourctl logs does."""

    def __str__(self):
        clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time_ms / 1000))
        return f"{clock}  {self.source}  {self.text}"


def _log_line(line):
    return LogLine(line.time_ms, line.source, line.text, line.sequence)


def _read_file(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DownpourError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise DownpourError(f"{what} {path} is a directory, not a file") from None
    except OSError as e:
        raise DownpourError(f"cannot read {what} {path}: {e.strerror}") from None


def load_job_spec(spec):
    """A JobSpec from a .pbtxt path (text format, as downpourctl submits), a
    JobSpec message (copied) or a dict (JobSpec's fields, as JSON names them
    or as in the proto)."""
    if isinstance(spec, job_pb2.JobSpec):
        copy = job_pb2.JobSpec()
        copy.CopyFrom(spec)
        return copy
    if isinstance(spec, dict):
        try:
            return json_format.ParseDict(spec, job_pb2.JobSpec())
        except json_format.ParseError as e:
            raise DownpourError(f"the job spec dict is not a JobSpec: {e}") from None
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        text = _read_file(path, "job spec file")
        try:
            return text_format.Parse(text.decode("utf-8"), job_pb2.JobSpec())
        except UnicodeDecodeError:
            raise DownpourError(f"job spec file {path} is not UTF-8 text") from None
        except text_format.ParseError as e:
            message = re.sub(r"^\d+:\d+ : ", "", str(e))
            where = f"{e.GetLine()}:{e.GetColumn()}" if e.GetLine() is not None else "1"
            raise DownpourError(f"{path}:{where}: {message}") from None
    raise DownpourError(f"a job spec is a .pbtxt path, a JobSpec or a dict, not "
                        f"{type(spec).__name__}")


def _seconds(value):
    return f"{value:g}s"


def _read_onnx(path):
    """The ONNX file's bytes, with weights kept beside it (external data, as
    torch.onnx.export's dynamo exporter writes them) read in when the onnx
    package is installed; without it the coordinator names what is missing."""
    data = _read_file(path, "model file")
    try:
        import onnx
        from onnx.external_data_helper import load_external_data_for_model
    except ImportError:
        return data
    try:
        model = onnx.load_from_string(data)
    except Exception:  # Not ONNX: the coordinator says so, naming the file.
        return data
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return data
    try:
        load_external_data_for_model(model, os.path.dirname(path) or ".")
        return model.SerializeToString()
    except (OSError, ValueError) as e:
        raise DownpourError(f"{path}: its weights kept beside it cannot be read in: {e}") from None


class Client:
    """A connection to a Downpour coordinator.

    The coordinator is, first match wins: `coordinator` ("HOST:PORT"), else
    `context`'s (a context of downpourctl's config file: `config`, default
    $XDG_CONFIG_HOME/downpour/config.yaml or ~/.config/downpour/config.yaml),
    else $DOWNPOUR_COORDINATOR, else the config file's current context, else
    127.0.0.1:7070. A coordinator that serves TLS needs `tls_ca`; you prove
    who you are with a bearer token (`token_file`, else $DOWNPOUR_TOKEN, else
    the context's token_file) or a client certificate (`tls_cert`,
    `tls_key`). Each TLS file defaults to the chosen context's.

    The constructor connects, and raises DownpourError if the coordinator
    cannot be reached within `connect_timeout` seconds.
    """

    def __init__(self, coordinator=None, *, context=None, config=None, tls_ca=None,
                 tls_cert=None, tls_key=None, token_file=None, timeout=10.0,
                 connect_timeout=5.0, long_timeout=600.0):
        config_path = config if config is not None else _config.default_config_path()
        address, source, chosen = _config.resolve(coordinator, context, config_path)
        _config.check_address(address, source)
        self.address = address
        self.source = source
        self.timeout = timeout
        self.long_timeout = long_timeout
        chosen = chosen or {}
        tls_ca = tls_ca or chosen.get("tls_ca")
        tls_cert = tls_cert or chosen.get("tls_cert")
        tls_key = tls_key or chosen.get("tls_key")
        if bool(tls_cert) != bool(tls_key):
            raise DownpourError("a client certificate needs both tls_cert and tls_key")
        self._tls = bool(tls_ca or tls_cert)
        token = _config.read_token(token_file, chosen)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE),
                   ("grpc.max_send_message_length", _MAX_MESSAGE),
                   # A coordinator that comes back is found within seconds,
                   # not after gRPC's default backoff (up to two minutes).
                   ("grpc.max_reconnect_backoff_ms", 2000)]
        if self._tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(tls_ca, "tls_ca") if tls_ca else None,
                private_key=_read_file(tls_key, "tls_key") if tls_key else None,
                certificate_chain=_read_file(tls_cert, "tls_cert") if tls_cert else None)
            self._channel = grpc.secure_channel(address, credentials, options)
        else:
            self._channel = grpc.insecure_channel(address, options)
        self._stub = coordinator_service_pb2_grpc.CoordinatorStub(self._channel)
        try:
            self._wait_connected(connect_timeout)
        except BaseException:
            self._channel.close()
            raise

    # ------------------------------------------------------------ plumbing

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"downpour.Client({self.address!r})"

    def _wait_connected(self, timeout):
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            why = ("down, unreachable, or its certificate is not from tls_ca's CA or does not "
                   "name that host" if self._tls else
                   "down, unreachable, or it serves TLS: give tls_ca")
            raise DownpourError(f"cannot reach coordinator at {self.address} within "
                                f"{_seconds(timeout)} ({why})",
                                code=grpc.StatusCode.UNAVAILABLE) from None

    def _error(self, name, error, timeout):
        code, details = error.code(), error.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            message = f"coordinator at {self.address} is unavailable ({name}: {details})"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            message = (f"coordinator at {self.address} did not answer {name} within "
                       f"{_seconds(timeout)}")
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            message = "the coordinator does not know who you are: " + details
        elif code == grpc.StatusCode.PERMISSION_DENIED:
            message = "the coordinator refused: " + details
        else:
            message = details or f"{name} failed: {code.name}"
        return DownpourError(message, code=code)

    def _call(self, name, request, timeout=None):
        timeout = self.timeout if timeout is None else timeout
        try:
            return getattr(self._stub, name)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(name, e, timeout) from None

    # ---------------------------------------------------------------- jobs

    def nodes(self):
        """Every shard and worker the coordinator knows (NodeInfo messages)."""
        return list(self._call("ListNodes", coordinator_pb2.ListNodesRequest()).nodes)

    def submit(self, spec, *, job_id=None, model=None, init_from=None):
        """Submits a job; returns its id.

        spec: a .pbtxt path, a JobSpec or a dict (load_job_spec). job_id: the
        new job's id (default: the coordinator picks NAME-N). model: an ONNX
        model, a path or its bytes, that the coordinator turns into the
        spec's model (which must then be empty). init_from: the weights to
        start from: "JOB" or "JOB@STEP" (a checkpoint of a job the
        coordinator knows), a .safetensors path, or a {name: array} dict
        (e.g. a PyTorch state_dict's tensors as NumPy arrays).
        """
        request = coordinator_pb2.SubmitJobRequest(spec=load_job_spec(spec),
                                                   job_id=job_id or "")
        long_call = False
        if model is not None:
            if isinstance(model, (bytes, bytearray, memoryview)):
                request.model_file.onnx, request.model_file.name = bytes(model), "(bytes)"
            else:
                path = os.fspath(model)
                request.model_file.onnx = _read_onnx(path)
                request.model_file.name = path
            long_call = True
        if init_from is not None:
            self._set_init_from(request.init_from, init_from)
            long_call = True
        job = self._call("SubmitJob", request,
                         self.long_timeout if long_call else self.timeout).job
        return job.id

    @staticmethod
    def _set_init_from(message, init_from):
        if isinstance(init_from, dict):
            message.weights = _safetensors.dump(init_from)
            message.weights_name = "the initial weights"
            return
        value = os.fspath(init_from)
        if value.endswith(".safetensors"):
            message.weights = _read_file(value, "init_from file")
            message.weights_name = value
            return
        job, at, step = value.partition("@")
        if not job or (at and not (step.isdigit())):
            raise DownpourError(f"init_from={value!r} is neither JOB, JOB@STEP, a "
                                ".safetensors file nor a dict of arrays")
        message.job_id, message.step = job, int(step) if at else 0

    def get(self, job_id):
        """The job's JobStatus: progress per rank, placement, checkpoints,
        evaluations, events."""
        return self._call("GetJob", coordinator_pb2.GetJobRequest(job_id=job_id))

    def describe(self, job_id):
        """The job's JobDescription: its status and sampled progress history."""
        return self._call("DescribeJob", coordinator_pb2.DescribeJobRequest(job_id=job_id))

    def list(self):
        """Every job, in submission order (JobStatus summaries)."""
        return list(self._call("ListJobs", coordinator_pb2.ListJobsRequest()).jobs)

    def stop(self, job_id):
        """Stops a pending or running job; returns its JobStatus."""
        return self._call("StopJob", coordinator_pb2.StopJobRequest(job_id=job_id)).job

    def delete(self, job_id, with_checkpoints=False):
        """Removes an ended job from the coordinator's store (and its
        checkpoint files with with_checkpoints=True)."""
        self._call("DeleteJob", coordinator_pb2.DeleteJobRequest(
            job_id=job_id, checkpoints=with_checkpoints))

    def checkpoint(self, job_id):
        """Asks for a checkpoint of a running job at its next step."""
        return self._call("CheckpointJob", coordinator_pb2.CheckpointJobRequest(job_id=job_id))

    def resume(self, job_id):
        """Continues a FAILED or STOPPED job from its newest checkpoint."""
        return self._call("ResumeJob", coordinator_pb2.ResumeJobRequest(job_id=job_id),
                          self.long_timeout)

    def wait(self, job_id, progress=True, *, timeout=None, reconnect_timeout=30.0,
             check=True, stream=None):
        """Follows the job until it ends (WatchJob long polls); returns its
        final JobStatus.

        progress: show a progress bar on `stream` (default stderr) and the
        final line downpourctl wait prints. timeout: give up after this many
        seconds (None: never). A coordinator that goes away is waited for
        up to reconnect_timeout seconds. check: raise DownpourError (its
        `job` the final status) when the job ends other than SUCCEEDED.
        """
        give_up = None if timeout is None else time.monotonic() + timeout
        bar = ProgressBar(job_id, stream) if progress else None
        known_version, lost_since = 0, None
        while True:
            poll = _WATCH_POLL_S
            if give_up is not None:
                left = give_up - time.monotonic()
                if left <= 0:
                    raise DownpourError(f"job {job_id} did not end within {_seconds(timeout)}",
                                        code=grpc.StatusCode.DEADLINE_EXCEEDED)
                poll = max(0.001, min(poll, left))
            request = coordinator_pb2.WatchJobRequest(job_id=job_id, known_version=known_version,
                                                      timeout_ms=int(poll * 1000))
            try:
                job = self._call("WatchJob", request, poll + _WATCH_GRACE_S)
            except DownpourError as e:
                if e.code not in _TRANSIENT:
                    raise
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    if bar:
                        bar.note(f"downpour: lost the coordinator at {self.address} ({e}); "
                                 f"reconnecting for up to {_seconds(reconnect_timeout)}")
                if now - lost_since >= reconnect_timeout:
                    raise DownpourError(
                        f"lost the coordinator at {self.address} while waiting for job "
                        f"{job_id} and could not reconnect within {_seconds(reconnect_timeout)}",
                        code=e.code) from None
                try:
                    self._wait_connected(reconnect_timeout - (now - lost_since))
                    time.sleep(0.2)  # Connected, yet the call failed: no spinning.
                except DownpourError:
                    pass
                known_version = 0  # A restarted coordinator counts versions afresh.
                continue
            if lost_since is not None:
                lost_since = None
                if bar:
                    bar.note(f"downpour: reconnected to the coordinator at {self.address}")
            known_version = job.version
            state = job_pb2.JobState.Name(job.state)
            if job.state in _TERMINAL:
                if bar:
                    bar.finish(final_line(job))
                if check and job.state != job_pb2.SUCCEEDED:
                    raise DownpourError(f"job {job.id} {state}" +
                                        (f": {job.message}" if job.message else ""), job=job)
                return job
            if bar:
                bar.update(job, state)

    def logs(self, job_id, follow=False, tail=None):
        """The job's log lines (LogLine: time_ms, source, text, sequence;
        str() formats one as downpourctl logs does).

        Without follow: a list of the lines the coordinator keeps now (the
        last `tail` of them). With follow: an iterator that yields each line
        as it comes, until the job has ended and its last lines are out.
        """
        if tail is not None and tail < 0:
            raise DownpourError(f"tail={tail} must not be negative")
        request = coordinator_pb2.JobLogsRequest(job_id=job_id)
        # The first answer is asked for now, so an unknown job raises here
        # even when following.
        response = self._call("JobLogs", request)
        lines = [_log_line(line) for line in response.lines]
        if tail:
            lines = lines[-tail:]
        if not follow:
            return lines
        return self._follow_logs(request, response, lines)

    def _follow_logs(self, request, response, lines):
        while True:
            yield from lines
            if response.lines:
                request.after_sequence = response.lines[-1].sequence
            if response.job_ended and not response.lines:
                return
            request.timeout_ms = int(_WATCH_POLL_S * 1000)
            response = self._call("JobLogs", request, _WATCH_POLL_S + _WATCH_GRACE_S)
            lines = [_log_line(line) for line in response.lines]

    # -------------------------------------------------------------- export

    def export_bytes(self, job_id, step=None, layout="pytorch"):
        """The model of the job's newest complete checkpoint (or the one at
        `step`) as the bytes of one safetensors file."""
        if layout not in ("pytorch", "native"):
            raise DownpourError(f"layout={layout!r} is unknown; use pytorch or native")
        if step is not None and step < 0:
            raise DownpourError(f"step={step} must not be negative")
        request = coordinator_pb2.ExportJobRequest(job_id=job_id, step=step or 0,
                                                   native_layout=layout == "native")
        try:
            chunks = self._stub.ExportJob(request, timeout=self.long_timeout,
                                          metadata=self._metadata)
            return b"".join(chunk.data for chunk in chunks)
        except grpc.RpcError as e:
            raise self._error("ExportJob", e, self.long_timeout) from None

    def export(self, job_id, step=None, layout="pytorch"):
        """The job's model as {name: numpy.ndarray}: in PyTorch's names and
        layouts by default (Linear weights [out, in], convolutions OIHW), so
        `model.load_state_dict({k: torch.from_numpy(v) for k, v in ...})`
        takes it; layout="native" gives Downpour's own."""
        tensors, _ = _safetensors.load(self.export_bytes(job_id, step, layout),
                                       f"the export of job {job_id}")
        return tensors

    def export_file(self, job_id, path, step=None, layout="pytorch"):
        """Writes the export as a safetensors file at `path`, and the job's
        spec beside it (PATH without .safetensors, + .spec.pbtxt), as
        downpourctl export does; returns the export's metadata (step,
        test accuracy, spec)."""
        data = self.export_bytes(job_id, step, layout)
        _, metadata = _safetensors.load(data, f"the export of job {job_id}")
        path = os.fspath(path)
        base = path[:-len(".safetensors")] if path.endswith(".safetensors") else path
        for target, contents in ((path, data),
                                 (base + ".spec.pbtxt",
                                  metadata.get("downpour.spec", "").encode())):
            _write_atomically(target, contents)
        return metadata


def _write_atomically(path, contents):
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(contents)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise DownpourError(f"cannot write {path}: {e.strerror}") from None


def final_line(job):
    """downpourctl wait's last line: job ID STATE steps=N test_accuracy=X
    wall_s=T (figures as the job measured them)."""
    figures = ""
    if job.test_accuracy >= 0:
        figures = f" test_accuracy={job.test_accuracy:.4f}"
        if job.HasField("test_auc"):
            figures += f" test_auc={job.test_auc:.4f}"
        if job.HasField("test_log_loss"):
            figures += f" test_log_loss={job.test_log_loss:.4f}"
    first = job.first_start_time_ms or job.start_time_ms or job.submit_time_ms
    end = job.end_time_ms or int(time.time() * 1000)
    wall = (end - first) / 1000 if first > 0 and end >= first else 0.0
    times = f" wall_s={wall:.1f}"
    if job.start_time_ms > 0 and job.start_time_ms != first:
        times += f" last_attempt_s={max(0, end - job.start_time_ms) / 1000:.1f}"
    return (f"job {job.id} {job_pb2.JobState.Name(job.state)} steps={job.step}"
            f"{figures}{times}")
