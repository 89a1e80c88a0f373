"""boto3 and botocore, the optional `aws` extra: imported here by the deploy commands and the
SageMaker calibration backend alike, so that neither imports the other."""

from __future__ import annotations

from llamadecide.errors import LlamaDecideError


class AWSError(LlamaDecideError):
    """An AWS step failed or cannot run; the message says which and what to do."""


def import_boto3():
    """boto3, or a one-line error naming the extra that installs it."""
    try:
        import boto3
    except ImportError:
        raise AWSError("the AWS commands need boto3: pip install 'llamadecide[aws]'") from None
    return boto3
