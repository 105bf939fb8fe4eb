"""clusters/: the `ray up` files validate against the schema Ray ships; the KubeRay manifests have
the structure the operator needs (kinds, GPU requests, an entrypoint naming a spec that exists)."""

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "clusters"


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_ray_up_files_match_ray_s_schema(name):
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((CLUSTERS / name).read_text())
    jsonschema.validate(config, schema)
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("CPU") == 0 and not head["resources"].get("GPU")  # the head runs no trial
    (gpu,) = [t for n, t in types.items() if n != config["head_node_type"]]
    assert gpu["min_workers"] == 0 and gpu["max_workers"] >= 1
    setup = " ".join(config["setup_commands"])
    assert re.search(r"torch==[\d.]+ --index-url https://download.pytorch.org/whl/cu\d+", setup)
    assert "pip install -e" in setup and config["file_mounts"]["~/sweep"] == "."
    header = (CLUSTERS / name).read_text().split("\ncluster_name:")[0]
    assert "Edit exactly these fields" in header and ("InstanceType" in header or "guestAccelerators" in header)
    assert "--dashboard-host=127.0.0.1" in " ".join(config["head_start_ray_commands"])


def gpu_requests(cluster_spec: dict) -> list[str]:
    return [c["resources"]["limits"].get("nvidia.com/gpu") for g in cluster_spec["workerGroupSpecs"]
            for c in g["template"]["spec"]["containers"]]


def test_kuberay_manifests():
    cluster = yaml.safe_load((CLUSTERS / "kuberay" / "raycluster.yaml").read_text())
    job = yaml.safe_load((CLUSTERS / "kuberay" / "rayjob.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    for spec in (cluster["spec"], job["spec"]["rayClusterSpec"]):
        assert spec["rayVersion"] == ray.__version__
        assert gpu_requests(spec) and all(int(n) >= 1 for n in gpu_requests(spec))
        assert all(g["minReplicas"] == 0 for g in spec["workerGroupSpecs"])
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    words = shlex.split(job["spec"]["entrypoint"].split("&&")[-1])
    assert words[:2] == ["sweep", "run"]
    assert (ROOT / words[2]).is_file(), words[2]
    assert words[words.index("--results") + 1].startswith(("s3://", "gs://"))
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_runtime_env_and_readme_commands():
    env = yaml.safe_load((CLUSTERS / "runtime_env.yaml").read_text())
    assert set(env) <= {"excludes", "env_vars", "pip", "working_dir", "py_modules"}
    readme = (CLUSTERS / "README.md").read_text()
    for command in ("ray up clusters/aws.yaml", "ray job submit", "--runtime-env clusters/runtime_env.yaml",
                    "sweep run specs/scaling.yaml --results s3://", "sweep status s3://", "sweep report s3://",
                    "ray down clusters/aws.yaml", "sweep plan specs/scaling.yaml"):
        assert command in readme, command
    for spec in re.findall(r"specs/\w+\.yaml", readme):
        assert (ROOT / spec).is_file(), spec
