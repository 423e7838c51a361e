"""The notebook stack users expect, in the Terra kernel over the protocol: matplotlib figures render
inline as image/png (also from values a co-executed loop computed), and `%pip` is the kernel's own
environment's pip."""
import base64
import sys
from pathlib import Path

from kernel_helpers import execute


def displayed_pngs(messages):
    return [base64.b64decode(m["content"]["data"]["image/png"]) for m in messages
            if m["msg_type"] in ("display_data", "execute_result")
            and "image/png" in m["content"].get("data", {})]


def ok(kc, code):
    reply, messages = execute(kc, code, timeout=120)
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert reply["status"] == "ok" and not errors, (reply, errors)
    return messages


def test_matplotlib_inline_figure_is_a_png(kernel):
    km, kc = kernel
    messages = ok(kc, "%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                      "plt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()")
    pngs = displayed_pngs(messages)
    assert len(pngs) == 1 and pngs[0].startswith(b"\x89PNG\r\n\x1a\n"), messages


def test_plot_of_a_coexecuted_training_loop(kernel):
    km, kc = kernel
    ok(kc, "import torch\ntorch.manual_seed(0)\n"
           "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "x, y = torch.randn(32, 4), torch.randn(32, 1)\nlosses = []\n"
           "for step in range(40):\n"
           "    opt.zero_grad()\n"
           "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
           "    loss.backward()\n"
           "    opt.step()\n"
           "    losses.append(loss.item())\n")
    messages = ok(kc, "import terra, matplotlib.pyplot as plt\n"
                      "assert terra.stats()['iterations_coexecuted'] > 0, terra.stats()\n"
                      "plt.figure(); plt.plot(losses); plt.show()\n"
                      "print(len(losses), losses[-1] < losses[0])")
    assert len(displayed_pngs(messages)) == 1
    out = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "40 True" in out, out


def test_pip_magic_is_the_kernels_own_environment(kernel):
    km, kc = kernel
    messages = ok(kc, "%pip --version")
    out = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    venv_site = str(Path(sys.prefix) / "lib")  # the test runs in the same venv as the kernel
    assert "pip " in out and venv_site in out, out
