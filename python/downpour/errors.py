"""The one exception every call of the client raises."""


class DownpourError(Exception):
    """An error of Downpour or of reaching it, as one sentence.

    str(error) is the message, the coordinator's own where it answered
    (`no job "x"`). `code` is the gRPC status code (grpc.StatusCode) where
    a call failed, else None; `job` is the final JobStatus when `wait`
    saw the job end other than SUCCEEDED, else None.
    """

    def __init__(self, message, code=None, job=None):
        super().__init__(message)
        self.code = code
        self.job = job
