"""`llamadecide deploy create | autoscale | batch | delete`: SageMaker with boto3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from llamadecide.cli.common import fail

deploy_app = typer.Typer(
    no_args_is_help=True, help="Deploy to Amazon SageMaker AI (real-time endpoints, auto scaling, batch transform)."
)

RegionOption = Annotated[Optional[str], typer.Option("--region", help="AWS region (default: AWS_REGION)")]


def _deployer(region: str | None):
    from llamadecide.sagemaker.deploy import Deployer, DeployError

    try:
        return Deployer(region=region)
    except DeployError as exc:
        raise fail(str(exc)) from exc


@deploy_app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", help="Endpoint name")],
    image: Annotated[str, typer.Option("--image", help="Container image URI in ECR (docker/Dockerfile.cpu or .cuda)")],
    role: Annotated[str, typer.Option("--role", help="SageMaker execution role ARN")],
    bucket: Annotated[str, typer.Option("--bucket", help="S3 bucket for model.tar.gz")],
    model: Annotated[
        Optional[Path], typer.Option("--model", help="GGUF to deploy (default: the bundled model)")
    ] = None,
    profiles_dir: Annotated[
        Optional[Path], typer.Option("--profiles-dir", help="Calibration profiles to ship with it")
    ] = None,
    instance_type: Annotated[str, typer.Option("--instance-type")] = "ml.c5.xlarge",
    instance_count: Annotated[int, typer.Option("--instance-count")] = 1,
    n_ctx: Annotated[Optional[int], typer.Option("--n-ctx")] = None,
    n_gpu_layers: Annotated[Optional[int], typer.Option("--n-gpu-layers")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads")] = None,
    api_key: Annotated[
        Optional[str], typer.Option("--api-key", help="Key for the container's /v1 routes (not /invocations)")
    ] = None,
    label_store: Annotated[
        Optional[str],
        typer.Option(
            "--label-store",
            help="s3://bucket/prefix every instance keeps review items and labels in (the role needs s3:GetObject, "
            "PutObject and ListBucket there)",
        ),
    ] = None,
    audit_rate: Annotated[
        Optional[float],
        typer.Option("--audit-rate", min=0.0, max=1.0, help="Share of automatic decisions drawn for review"),
    ] = None,
    a2i_flow_definition: Annotated[
        Optional[str],
        typer.Option("--a2i-flow-definition", help="A2I flow definition ARN: queued decisions start human loops"),
    ] = None,
    startup_timeout: Annotated[
        int, typer.Option("--startup-timeout", help="Container start-up health check timeout (s)")
    ] = 600,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once creation has started")] = False,
    region: RegionOption = None,
) -> None:
    """Package the GGUF (and profiles) as model.tar.gz, upload it, create model, config and endpoint, wait,
    smoke-test."""
    import tempfile

    from llamadecide.engine.model_files import resolve_model_path
    from llamadecide.sagemaker.deploy import DeployError, EndpointSpec, container_environment, package_model

    if label_store is not None and not label_store.startswith("s3://"):
        raise fail(
            "--label-store must be s3://bucket/prefix: an endpoint's instances share it, and their disks are not kept"
        )
    deployer = _deployer(region)
    try:
        gguf = resolve_model_path(str(model) if model else None)
        with tempfile.TemporaryDirectory() as tmp:
            archive = package_model(gguf, Path(tmp) / "model.tar.gz", profiles_dir=profiles_dir)
            url = deployer.upload(archive, bucket, f"llamadecide/{name}/model.tar.gz")
        extra = {
            name: str(value)
            for name, value in (
                ("LLAMA_API_KEY", api_key),
                ("LLAMADECIDE_LABEL_STORE", label_store),
                ("LLAMADECIDE_AUDIT_RATE", audit_rate),
                ("LLAMADECIDE_A2I_FLOW_DEFINITION", a2i_flow_definition),
            )
            if value is not None
        }
        spec = EndpointSpec(
            name=name,
            image_uri=image,
            role_arn=role,
            model_data_url=url,
            instance_type=instance_type,
            instance_count=instance_count,
            startup_timeout_s=startup_timeout,
            environment=container_environment(n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, threads=threads, extra=extra),
        )
        result = deployer.create(spec, wait=not no_wait)
    except (DeployError, Exception) as exc:  # noqa: BLE001 - every failure reaches the user as one line
        raise fail(str(getattr(exc, "message", exc))) from exc
    typer.echo(json.dumps(result, indent=2, default=str))


@deploy_app.command("autoscale")
def autoscale(
    name: Annotated[str, typer.Option("--name", help="Endpoint name")],
    min_instances: Annotated[int, typer.Option("--min")] = 1,
    max_instances: Annotated[int, typer.Option("--max")] = 4,
    target: Annotated[
        float, typer.Option("--invocations-per-instance", help="Target invocations per instance per minute")
    ] = 100.0,
    region: RegionOption = None,
) -> None:
    """Target-tracking auto scaling on invocations per instance."""
    from llamadecide.sagemaker.deploy import DeployError

    try:
        result = _deployer(region).autoscale(
            name, min_instances=min_instances, max_instances=max_instances, invocations_per_instance=target
        )
    except DeployError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps(result, indent=2))


@deploy_app.command("batch")
def batch(
    model_name: Annotated[str, typer.Option("--model-name", help="SageMaker model (e.g. ENDPOINT-model)")],
    input_s3: Annotated[
        str, typer.Option("--input", help="s3:// prefix of JSON Lines files, one decision body per line")
    ],
    output_s3: Annotated[str, typer.Option("--output", help="s3:// prefix for the results")],
    job_name: Annotated[str, typer.Option("--job-name")] = "",
    instance_type: Annotated[str, typer.Option("--instance-type")] = "ml.c5.xlarge",
    instance_count: Annotated[int, typer.Option("--instance-count")] = 1,
    region: RegionOption = None,
) -> None:
    """A batch-transform job for offline bulk decisions."""
    import time

    from llamadecide.sagemaker.deploy import DeployError

    try:
        result = _deployer(region).batch(
            job_name=job_name or f"llamadecide-{int(time.time())}",
            model_name=model_name,
            input_s3=input_s3,
            output_s3=output_s3,
            instance_type=instance_type,
            instance_count=instance_count,
        )
    except DeployError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps(result, indent=2))


@deploy_app.command("delete")
def delete(name: Annotated[str, typer.Option("--name", help="Endpoint name")], region: RegionOption = None) -> None:
    """Delete the endpoint, its configuration and its model."""
    from llamadecide.sagemaker.deploy import DeployError

    try:
        removed = _deployer(region).delete(name)
    except DeployError as exc:
        raise fail(str(exc)) from exc
    typer.echo("\n".join(removed) or "nothing to delete")
