"""SageMaker control plane with boto3: package and upload the model, create the model, endpoint
configuration and endpoint, wait, smoke-test, auto scaling, batch transform, teardown.
Scale-out is SageMaker's own (instance count, target tracking, batch transform)."""

from __future__ import annotations

import json
import logging
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamadecide.aws import AWSError, import_boto3

log = logging.getLogger(__name__)


DeployError = AWSError  # a deployment step failed; the message says which and what to do


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    image_uri: str
    role_arn: str
    model_data_url: str
    instance_type: str = "ml.c5.xlarge"
    instance_count: int = 1
    environment: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: int = 600
    variant: str = "AllTraffic"


def package_model(gguf: Path, out: Path, *, profiles_dir: Path | None = None) -> Path:
    """model.tar.gz holding the GGUF at its root and calibration profiles under profiles/, the prompt_format
    the container finds under /opt/ml/model."""
    gguf = Path(gguf)
    if not gguf.is_file() or gguf.suffix != ".gguf":
        raise DeployError(f"{gguf} is not a .gguf file")
    out = Path(out)
    with tarfile.open(out, "w:gz") as archive:
        archive.add(gguf, arcname=gguf.name)
        if profiles_dir is not None:
            from llamadecide.calibration.profile import profile_files

            for n, profile in enumerate(profile_files(Path(profiles_dir))):
                # Folders of calibrate output all hold a profile.json: number them apart.
                name = profile.name if profile.name != "profile.json" else f"profile-{n}.json"
                archive.add(profile, arcname=f"profiles/{name}")
    return out


def container_environment(
    *,
    n_ctx: int | None = None,
    n_gpu_layers: int | None = None,
    threads: int | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The container's settings in the AWS llama.cpp container's SM_LLAMA_CPP_* convention."""
    env: dict[str, str] = {}
    if n_ctx is not None:
        env["SM_LLAMA_CPP_CTX_SIZE"] = str(n_ctx)
    if n_gpu_layers is not None:
        env["SM_LLAMA_CPP_N_GPU_LAYERS"] = str(n_gpu_layers)
    if threads is not None:
        env["SM_LLAMA_CPP_THREADS"] = str(threads)
    env.update(extra or {})
    return env


class Deployer:
    def __init__(
        self,
        session: Any = None,
        *,
        region: str | None = None,
        poll_seconds: float = 15.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        boto3 = import_boto3()
        from botocore.exceptions import NoRegionError

        self.session = session or boto3.Session(region_name=region)
        if not self.session.region_name:
            raise DeployError("no AWS region: pass --region or set AWS_REGION / AWS_DEFAULT_REGION")
        try:
            self.sagemaker = self.session.client("sagemaker")
            self.runtime = self.session.client("sagemaker-runtime")
            self.s3 = self.session.client("s3")
            self.autoscaling = self.session.client("application-autoscaling")
        except NoRegionError as exc:  # pragma: no cover - region checked above
            raise DeployError(str(exc)) from exc
        self.poll_seconds = poll_seconds
        self.sleep = sleep

    # -- helpers ----------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            return fn(**kwargs)
        except NoCredentialsError as exc:
            raise DeployError(f"{what}: no AWS credentials (configure a profile or AWS_ACCESS_KEY_ID)") from exc
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise DeployError(f"{what} failed: {error.get('Code')}: {error.get('Message')}") from exc
        except BotoCoreError as exc:
            raise DeployError(f"{what} failed: {exc}") from exc

    @staticmethod
    def _check(spec: EndpointSpec) -> None:
        if not spec.role_arn or not spec.role_arn.startswith("arn:"):
            raise DeployError("an execution role ARN is required (--role arn:aws:iam::ACCOUNT:role/NAME)")
        if not spec.image_uri:
            raise DeployError(
                "a container image URI is required (--image ACCOUNT.dkr.ecr.REGION.amazonaws.com/llamadecide:TAG)"
            )
        if not spec.model_data_url.startswith("s3://"):
            raise DeployError("the model data must be an s3:// URL of model.tar.gz")
        if spec.instance_count < 1:
            raise DeployError("instance count must be at least 1")

    # -- steps ------------------------------------------------------------------------------

    def upload(self, archive: Path, bucket: str, key: str) -> str:
        self._call("upload to S3", self.s3.upload_file, Filename=str(archive), Bucket=bucket, Key=key)
        return f"s3://{bucket}/{key}"

    def create(
        self, spec: EndpointSpec, *, wait: bool = True, timeout_s: float = 1800, smoke_test: bool = True
    ) -> dict:
        self._check(spec)
        model_name, config_name = f"{spec.name}-model", f"{spec.name}-config"
        self._call(
            "create model",
            self.sagemaker.create_model,
            ModelName=model_name,
            ExecutionRoleArn=spec.role_arn,
            PrimaryContainer={
                "Image": spec.image_uri,
                "ModelDataUrl": spec.model_data_url,
                "Environment": dict(spec.environment),
            },
        )
        self._call(
            "create endpoint configuration",
            self.sagemaker.create_endpoint_config,
            EndpointConfigName=config_name,
            ProductionVariants=[
                {
                    "VariantName": spec.variant,
                    "ModelName": model_name,
                    "InstanceType": spec.instance_type,
                    "InitialInstanceCount": spec.instance_count,
                    "ContainerStartupHealthCheckTimeoutInSeconds": spec.startup_timeout_s,
                }
            ],
        )
        self._call(
            "create endpoint", self.sagemaker.create_endpoint, EndpointName=spec.name, EndpointConfigName=config_name
        )
        result = {"endpoint": spec.name, "model": model_name, "endpoint_config": config_name, "status": "Creating"}
        if wait:
            result["status"] = self.wait(spec.name, timeout_s=timeout_s)
            if smoke_test:
                result["smoke_test"] = self.smoke_test(spec.name)
        return result

    def wait(self, endpoint: str, *, timeout_s: float = 1800) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self._call("describe endpoint", self.sagemaker.describe_endpoint, EndpointName=endpoint)
            state = status["EndpointStatus"]
            if state == "InService":
                return state
            if state in ("Failed", "OutOfService"):
                raise DeployError(f"endpoint {endpoint} is {state}: {status.get('FailureReason', 'no reason given')}")
            if time.monotonic() > deadline:
                raise DeployError(f"endpoint {endpoint} still {state} after {timeout_s:.0f} s")
            self.sleep(self.poll_seconds)

    def smoke_test(self, endpoint: str) -> dict:
        body = {
            "model": "default",
            "input": "I was charged twice for my subscription.",
            "questions": [
                {
                    "type": "choice",
                    "instructions": "Which team?",
                    "choices": [{"value": "billing"}, {"value": "support"}],
                }
            ],
        }
        response = self._call(
            "invoke endpoint",
            self.runtime.invoke_endpoint,
            EndpointName=endpoint,
            ContentType="application/json",
            Accept="application/json",
            CustomAttributes="route=/v1/decisions",
            Body=json.dumps(body).encode(),
        )
        answer = json.loads(response["Body"].read())["answers"][0]
        if abs(sum(p["probability"] for p in answer["probabilities"]) - 1) > 1e-6:
            raise DeployError(f"smoke test: probabilities do not sum to 1: {answer}")
        return answer

    def autoscale(
        self,
        endpoint: str,
        *,
        min_instances: int,
        max_instances: int,
        invocations_per_instance: float,
        variant: str = "AllTraffic",
        scale_in_cooldown: int = 300,
        scale_out_cooldown: int = 60,
    ) -> dict:
        if not 1 <= min_instances <= max_instances:
            raise DeployError("need 1 <= min instances <= max instances")
        if invocations_per_instance <= 0:
            raise DeployError("the target invocations per instance must be positive")
        resource = f"endpoint/{endpoint}/variant/{variant}"
        dimension = "sagemaker:variant:DesiredInstanceCount"
        self._call(
            "register scalable target",
            self.autoscaling.register_scalable_target,
            ServiceNamespace="sagemaker",
            ResourceId=resource,
            ScalableDimension=dimension,
            MinCapacity=min_instances,
            MaxCapacity=max_instances,
        )
        policy = self._call(
            "put scaling policy",
            self.autoscaling.put_scaling_policy,
            PolicyName=f"{endpoint}-invocations",
            ServiceNamespace="sagemaker",
            ResourceId=resource,
            ScalableDimension=dimension,
            PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": float(invocations_per_instance),
                "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
                "ScaleInCooldown": scale_in_cooldown,
                "ScaleOutCooldown": scale_out_cooldown,
            },
        )
        return {"resource": resource, "policy_arn": policy.get("PolicyARN")}

    def batch(
        self,
        *,
        job_name: str,
        model_name: str,
        input_s3: str,
        output_s3: str,
        instance_type: str = "ml.c5.xlarge",
        instance_count: int = 1,
        max_payload_mb: int = 1,
        timeout_s: int = 3600,
    ) -> dict:
        """Offline bulk decisions: JSON Lines files in S3, one decision body per line. SageMaker sends
        /invocations as many whole lines as fit `max_payload_mb` at once (MultiRecord; 1 MB, the
        least it takes, is well under the server's 6 MB body limit), the server decides them in
        shared engine calls and answers a line per record, and the output is assembled line by line.
        A payload may hold thousands of short records, so each invocation may take up to `timeout_s`
        (SageMaker's most: one hour)."""
        if not (input_s3.startswith("s3://") and output_s3.startswith("s3://")):
            raise DeployError("batch input and output must be s3:// URLs")
        self._call(
            "create transform job",
            self.sagemaker.create_transform_job,
            TransformJobName=job_name,
            ModelName=model_name,
            BatchStrategy="MultiRecord",
            MaxPayloadInMB=max_payload_mb,
            ModelClientConfig={"InvocationsTimeoutInSeconds": timeout_s, "InvocationsMaxRetries": 1},
            TransformInput={
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": input_s3}},
                "ContentType": "application/jsonlines",
                "SplitType": "Line",
            },
            TransformOutput={"S3OutputPath": output_s3, "Accept": "application/jsonlines", "AssembleWith": "Line"},
            TransformResources={"InstanceType": instance_type, "InstanceCount": instance_count},
        )
        return {"job": job_name, "output": output_s3}

    def delete(self, endpoint: str) -> list[str]:
        """Endpoint, then its configuration and model; tolerant of parts already gone."""
        from botocore.exceptions import ClientError, NoCredentialsError

        try:
            try:
                config = self.sagemaker.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"]
                variants = self.sagemaker.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"]
                model = variants[0]["ModelName"] if variants else None
            except ClientError:
                config, model = f"{endpoint}-config", f"{endpoint}-model"
            removed: list[str] = []
            sm = self.sagemaker
            for what, fn, key, name in (
                ("endpoint", sm.delete_endpoint, "EndpointName", endpoint),
                ("endpoint config", sm.delete_endpoint_config, "EndpointConfigName", config),
                ("model", sm.delete_model, "ModelName", model),
            ):
                if name is None:
                    continue
                try:
                    fn(**{key: name})
                    removed.append(f"{what} {name}")
                except ClientError as exc:
                    log.info("%s already gone: %s", what, exc)
            return removed
        except NoCredentialsError as exc:
            raise DeployError("delete: no AWS credentials (configure a profile or AWS_ACCESS_KEY_ID)") from exc
