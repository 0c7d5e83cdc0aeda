"""SGLang's CPU environment as kvscope assembles it: the sgl_kernel compatibility shim's one op,
its loud refusal of any other, and torchvision's op schemas declared before torchvision imports
(the .pth mechanism, in a real interpreter). SGLang itself serves in tests/sglang_live."""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from kvscope.engines import sglang_install


def shim() -> ModuleType:
    path = sglang_install.SHIMS / "sgl_kernel" / "__init__.py"
    spec = importlib.util.spec_from_file_location("sgl_kernel_shim_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_op_fills_each_requests_row_from_its_share_of_the_new_slots() -> None:
    # SGLang's triton kernel: request i writes out_cache_loc[sum of earlier lengths : + its own]
    # into req_to_token[req_pool_indices[i], start_i:end_i] (numpy arrays: the op uses only
    # .tolist() and slicing, as on torch tensors).
    req_to_token = np.zeros((4, 8), dtype=np.int64)
    rows, starts, ends = np.array([2, 0, 3]), np.array([1, 0, 5]), np.array([4, 2, 5])
    out_cache_loc = np.array([10, 11, 12, 20, 21])
    shim().assign_req_to_token_pool_cpu(rows, req_to_token, starts, ends, out_cache_loc, 8)
    expected = np.zeros((4, 8), dtype=np.int64)
    expected[2, 1:4] = [10, 11, 12]
    expected[0, 0:2] = [20, 21]  # request 3 has an empty range: nothing written
    assert (req_to_token == expected).all()


def test_any_other_op_imports_but_raises_naming_itself() -> None:
    module = shim()
    op = module.copy_all_layer_kv_cache_cpu  # importable: SGLang imports it at module level
    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        op(1, 2)
    with pytest.raises(AttributeError):
        module.__wrapped__  # noqa: B018  (dunder lookups are not ops)


def test_torchvision_ops_are_declared_before_torchvision_imports(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    sglang_install._place_shims(tmp_path / "venv")
    assert (site / sglang_install.PTH).read_text().strip() == "import kvscope_torchvision_ops"
    assert (site / "sgl_kernel" / "__init__.py").exists()
    fakes = tmp_path / "fakes"  # a torch that records definitions; a torchvision that needs them
    (fakes / "torch").mkdir(parents=True)
    (fakes / "torch" / "__init__.py").write_text(
        textwrap.dedent("""
        import types
        DEFINED = []
        class Library:
            def __init__(self, ns, kind):
                self.ns = ns
            def define(self, schema):
                DEFINED.append(self.ns + "::" + schema.split("(")[0])
        library = types.SimpleNamespace(Library=Library)
    """)
    )
    (fakes / "torchvision").mkdir()
    (fakes / "torchvision" / "__init__.py").write_text(
        textwrap.dedent("""
        import torch
        if "torchvision::nms" not in torch.DEFINED:
            raise RuntimeError("operator torchvision::nms does not exist")
    """)
    )
    code = (
        f"import site, sys; sys.path.insert(0, {str(fakes)!r}); site.addsitedir({str(site)!r}); "
        "import torch; assert torch.DEFINED == [], 'declared before torchvision was asked for'; "
        "import torchvision; print(sorted(torch.DEFINED))"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['torchvision::nms', 'torchvision::qnms']"


def test_an_install_is_complete_only_with_its_whole_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    assert not sglang_install.complete(cpu=True)
    cpu = sglang_install.spec(cpu=True)
    assert cpu["torch"] == "torch==2.13.0" and cpu["sglang"] == "sglang==0.5.23"
    assert cpu["shims"] == sglang_install.spec(cpu=True)["shims"]  # a digest of the sources
    assert sglang_install.spec(cpu=False) == {"requirements": ["sglang==0.5.23"]}
    root = sglang_install.venv_root(cpu=True)
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    (root / "kvscope-install.json").write_text('{"torch": "torch==2.12.0"}')  # another spec
    assert not sglang_install.complete(cpu=True)
