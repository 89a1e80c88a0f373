"""The SageMaker control plane against moto: arguments of every call, waiting, failures, teardown."""

from __future__ import annotations

import io
import json
import tarfile

import boto3
import pytest
from moto import mock_aws

from llamadecide.sagemaker.deploy import Deployer, DeployError, EndpointSpec, container_environment, package_model

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llamadecide:cpu"


@pytest.fixture()
def aws(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket="models")
        yield


@pytest.fixture()
def deployer(aws):
    return Deployer(region=REGION, poll_seconds=0, sleep=lambda s: None)


def spec(**kw):
    base = dict(
        name="ld-test",
        image_uri=IMAGE,
        role_arn=ROLE,
        model_data_url="s3://models/ld/model.tar.gz",
        instance_type="ml.c5.xlarge",
        instance_count=2,
        startup_timeout_s=900,
        environment=container_environment(n_ctx=2048, n_gpu_layers=0, threads=4),
    )
    base.update(kw)
    return EndpointSpec(**base)


def test_package_holds_the_gguf_and_profiles(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF....")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.json").write_text("{}")
    archive = package_model(gguf, tmp_path / "model.tar.gz", profiles_dir=tmp_path / "profiles")
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["m.gguf", "profiles/p.json"]
    with pytest.raises(DeployError, match="not a .gguf"):
        package_model(tmp_path / "profiles" / "p.json", tmp_path / "x.tar.gz")


def test_upload_and_create_pass_every_argument(deployer, tmp_path):
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(b"archive")
    assert deployer.upload(archive, "models", "ld/model.tar.gz") == "s3://models/ld/model.tar.gz"
    assert boto3.client("s3").get_object(Bucket="models", Key="ld/model.tar.gz")["Body"].read() == b"archive"
    result = deployer.create(spec(), wait=False)
    assert result == {
        "endpoint": "ld-test",
        "model": "ld-test-model",
        "endpoint_config": "ld-test-config",
        "status": "Creating",
    }
    sm = boto3.client("sagemaker")
    model = sm.describe_model(ModelName="ld-test-model")
    assert model["ExecutionRoleArn"] == ROLE
    assert model["PrimaryContainer"]["Image"] == IMAGE
    assert model["PrimaryContainer"]["ModelDataUrl"] == "s3://models/ld/model.tar.gz"
    assert model["PrimaryContainer"]["Environment"] == {
        "SM_LLAMA_CPP_CTX_SIZE": "2048",
        "SM_LLAMA_CPP_N_GPU_LAYERS": "0",
        "SM_LLAMA_CPP_THREADS": "4",
    }
    variant = sm.describe_endpoint_config(EndpointConfigName="ld-test-config")["ProductionVariants"][0]
    assert (variant["ModelName"], variant["InstanceType"], variant["InitialInstanceCount"]) == (
        "ld-test-model",
        "ml.c5.xlarge",
        2,
    )
    assert sm.describe_endpoint(EndpointName="ld-test")["EndpointConfigName"] == "ld-test-config"


def test_wait_polls_until_in_service_and_reports_failure(deployer):
    statuses = iter([{"EndpointStatus": "Creating"}, {"EndpointStatus": "Creating"}, {"EndpointStatus": "InService"}])
    deployer.sagemaker.describe_endpoint = lambda **kw: next(statuses)
    slept = []
    deployer.sleep = slept.append
    assert deployer.wait("ld-test") == "InService" and len(slept) == 2
    deployer.sagemaker.describe_endpoint = lambda **kw: {
        "EndpointStatus": "Failed",
        "FailureReason": "ping did not answer",
    }
    with pytest.raises(DeployError, match="ping did not answer"):
        deployer.wait("ld-test")
    deployer.sagemaker.describe_endpoint = lambda **kw: {"EndpointStatus": "Creating"}
    with pytest.raises(DeployError, match="still Creating"):
        deployer.wait("ld-test", timeout_s=0)


def test_smoke_test_reads_the_decision(deployer):
    calls = []

    class Runtime:
        def invoke_endpoint(self, **kwargs):
            calls.append(kwargs)
            body = {
                "answers": [
                    {
                        "type": "choice",
                        "choice": "billing",
                        "confidence": 0.5,
                        "probabilities": [
                            {"value": "billing", "probability": 0.75},
                            {"value": "support", "probability": 0.25},
                        ],
                    }
                ]
            }
            return {"Body": io.BytesIO(json.dumps(body).encode())}

    deployer.runtime = Runtime()
    assert deployer.smoke_test("ld-test")["choice"] == "billing"
    assert calls[0]["CustomAttributes"] == "route=/v1/decisions" and calls[0]["ContentType"] == "application/json"
    assert json.loads(calls[0]["Body"])["questions"][0]["type"] == "choice"


def test_autoscaling_target_tracking(deployer):
    deployer.create(spec(), wait=False)
    result = deployer.autoscale("ld-test", min_instances=1, max_instances=5, invocations_per_instance=120)
    aas = boto3.client("application-autoscaling")
    target = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"][0]
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (
        "endpoint/ld-test/variant/AllTraffic",
        1,
        5,
    )
    policy = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"][0]
    config = policy["TargetTrackingScalingPolicyConfiguration"]
    assert config["TargetValue"] == 120.0
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"
    assert result["resource"] == "endpoint/ld-test/variant/AllTraffic"
    with pytest.raises(DeployError, match="min instances"):
        deployer.autoscale("ld-test", min_instances=3, max_instances=2, invocations_per_instance=10)


def test_batch_transform_job(deployer):
    deployer.create(spec(), wait=False)
    deployer.batch(
        job_name="bulk-1", model_name="ld-test-model", input_s3="s3://models/in/", output_s3="s3://models/out/"
    )
    job = boto3.client("sagemaker").describe_transform_job(TransformJobName="bulk-1")
    assert job["ModelName"] == "ld-test-model" and job["BatchStrategy"] == "MultiRecord"
    assert job["TransformInput"]["SplitType"] == "Line" and job["TransformOutput"]["AssembleWith"] == "Line"
    assert job["TransformInput"]["ContentType"] == "application/jsonlines" and job["MaxPayloadInMB"] <= 6
    with pytest.raises(DeployError, match="s3://"):
        deployer.batch(job_name="b", model_name="m", input_s3="/local", output_s3="s3://x/")


def test_delete_removes_endpoint_config_and_model(deployer):
    deployer.create(spec(), wait=False)
    removed = deployer.delete("ld-test")
    assert removed == ["endpoint ld-test", "endpoint config ld-test-config", "model ld-test-model"]
    sm = boto3.client("sagemaker")
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []
    assert deployer.delete("ld-test") == []  # already gone: nothing, and no error


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(role_arn=""), "execution role"),
        (dict(image_uri=""), "image URI"),
        (dict(model_data_url="/tmp/model.tar.gz"), "s3://"),
    ],
)
def test_clear_errors_for_missing_parts(deployer, bad, message):
    with pytest.raises(DeployError, match=message):
        deployer.create(spec(**bad), wait=False)


def test_missing_region_and_credentials(monkeypatch):
    for key in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    with pytest.raises(DeployError, match="no AWS region"):
        Deployer()
    deployer = Deployer(region=REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(DeployError, match="no AWS credentials"):
        deployer.create(spec(), wait=False)


def test_delete_without_credentials_is_a_clear_error(monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(DeployError, match="no AWS credentials"):
        Deployer(region=REGION).delete("ld-test")


def test_a_calibrate_output_folder_is_packaged_as_its_profile_only(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF....")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("profile.json", "summary.json"):
        (run / name).write_text("{}")
    with tarfile.open(package_model(gguf, tmp_path / "model.tar.gz", profiles_dir=run)) as tar:
        assert sorted(tar.getnames()) == ["m.gguf", "profiles/profile-0.json"]


def test_without_boto3_the_aws_commands_name_the_extra(monkeypatch, tmp_path):
    """A plain install has no boto3: one line naming `llamadecide[aws]`, no traceback."""
    import sys

    from typer.testing import CliRunner

    from llamadecide.cli.main import app

    monkeypatch.setitem(sys.modules, "boto3", None)  # what a missing package looks like to `import`
    with pytest.raises(DeployError, match=r"pip install 'llamadecide\[aws\]'"):
        Deployer(region=REGION)
    result = CliRunner().invoke(app, ["deploy", "delete", "--name", "x", "--region", REGION])
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit)
    assert "llamadecide[aws]" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(
        app,
        [
            "deploy",
            "create",
            "--name",
            "x",
            "--image",
            IMAGE,
            "--role",
            ROLE,
            "--bucket",
            "b",
            "--region",
            REGION,
            "--model",
            str(tmp_path / "m.gguf"),
        ],
    )
    assert result.exit_code == 2 and "llamadecide[aws]" in result.output and "Traceback" not in result.output
