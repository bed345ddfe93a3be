"""Hot reload of a policy mounted from a Kubernetes ConfigMap.

The kubelet never edits a mounted file: it writes the new content into a fresh timestamped folder, points
a temporary symlink at it, renames that over `..data` (atomic) and deletes the old folder. The mounted
`policy.yaml` is itself a symlink to `..data/policy.yaml`. These tests replay that swap on a temp dir.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gateway.admin.policy_reload import PolicyWatcher
from gateway.app import SwitchyardPlugin
from gateway.config.settings import settings_from_text

POLICY = "name: {name}\nroutes:\n  default:\n    prefer: any\n    strategy: {{least-outstanding: 1}}\n"
CONFIG = """
policy: {{file: {policy}}}
pools:
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 2.9
    backends:
      - {{name: h100-a, url: "http://127.0.0.1:9", models: [m], max_model_len: 4096}}
"""


def _publish(mount: Path, stamp: str, content: str, keep_times_of: Path | None = None) -> None:
    """One ConfigMap update, as the kubelet's AtomicWriter does it."""
    folder = mount / f"..{stamp}"
    folder.mkdir()
    (folder / "policy.yaml").write_text(content)
    if keep_times_of is not None:  # a coarse-timestamp filesystem: the new file has the old one's mtime
        old = os.stat(keep_times_of)
        os.utime(folder / "policy.yaml", ns=(old.st_atime_ns, old.st_mtime_ns))
    previous = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    os.symlink(folder.name, mount / "..data_tmp")
    os.rename(mount / "..data_tmp", mount / "..data")
    if not (mount / "policy.yaml").is_symlink():
        os.symlink("..data/policy.yaml", mount / "policy.yaml")
    if previous is not None:
        shutil.rmtree(mount / previous)


def _watcher(tmp_path: Path) -> tuple[PolicyWatcher, SwitchyardPlugin]:
    mount = tmp_path / "config"
    mount.mkdir()
    _publish(mount, "2026_11_23_10_00_00.000000001", POLICY.format(name="first"))
    settings = settings_from_text(CONFIG.format(policy=mount / "policy.yaml"), str(tmp_path / "gateway.yaml"))
    plugin = SwitchyardPlugin(settings)
    watcher = PolicyWatcher(mount / "policy.yaml", plugin.pipeline, plugin.pipeline.catalog, 1.0)
    return watcher, plugin


def test_a_configmap_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    watcher, plugin = _watcher(tmp_path)
    assert plugin.pipeline.router.name == "first"
    _publish(tmp_path / "config", "2026_11_23_10_05_00.000000002", POLICY.format(name="second-one"))
    assert watcher.check()
    assert plugin.pipeline.router.name == "second-one"
    assert not watcher.check()  # nothing changed since


def test_a_swap_to_a_file_of_the_same_size_and_mtime_is_picked_up(tmp_path: Path) -> None:
    watcher, plugin = _watcher(tmp_path)
    mount = tmp_path / "config"
    _publish(
        mount,
        "2026_11_23_10_05_00.000000002",
        POLICY.format(name="fresh"),
        keep_times_of=mount / "policy.yaml",
    )
    assert watcher.check()
    assert plugin.pipeline.router.name == "fresh"


def test_a_broken_swap_keeps_the_last_good_policy(tmp_path: Path) -> None:
    watcher, plugin = _watcher(tmp_path)
    _publish(tmp_path / "config", "2026_11_23_10_05_00.000000002", "name: broken\nroutes: 7\n")
    assert not watcher.check()
    assert plugin.pipeline.router.name == "first"
    assert watcher.rejected == 1
