"""Widgets through xeus's comms: an ipywidgets slider and an anywidget widget each open a comm
and display a view of it; state sent by the frontend reaches the kernel-side model."""
from kernel_helpers import collect, execute, opened_and_displayed, stdout


def test_ipywidgets_slider_opens_comm_and_displays(kernel):
    km, kc = kernel
    reply, messages = execute(
        kc, "import ipywidgets as widgets\nslider = widgets.IntSlider(value=3, max=10)\n"
            "display(slider)")
    assert reply["status"] == "ok", reply
    opened, _ = opened_and_displayed(messages, "IntSliderModel")
    assert opened["data"]["state"]["value"] == 3

    # The frontend moves the slider: the kernel-side model follows.
    update = kc.session.msg("comm_msg", {"comm_id": opened["comm_id"], "data": {
        "method": "update", "state": {"value": 7}, "buffer_paths": []}})
    kc.shell_channel.send(update)
    collect(kc, update["header"]["msg_id"])
    reply, messages = execute(kc, "print(slider.value)")
    assert stdout(messages) == "7\n"


def test_anywidget_opens_comm_and_displays(kernel):
    km, kc = kernel
    code = (
        "import anywidget, traitlets\n"
        "class Counter(anywidget.AnyWidget):\n"
        "    _esm = 'export default { render({ model, el }) { el.textContent = model.get(\"count\"); } }'\n"
        "    count = traitlets.Int(5).tag(sync=True)\n"
        "counter = Counter()\n"
        "display(counter)"
    )
    reply, messages = execute(kc, code)
    assert reply["status"] == "ok", reply
    opened, _ = opened_and_displayed(messages, "AnyModel")
    state = opened["data"]["state"]
    assert state["_model_module"] == "anywidget" and state["_view_name"] == "AnyView"
    assert "export default" in state["_esm"] and state["count"] == 5


def test_comm_on_unregistered_target_does_not_kill_the_kernel(kernel):
    km, kc = kernel
    reply, messages = execute(
        kc, "from comm import create_comm\nc = create_comm(target_name='nobody.listens', data={'a': 1})")
    assert reply["status"] == "ok", reply
    assert any(m["msg_type"] == "comm_open" and m["content"]["target_name"] == "nobody.listens"
               for m in messages)
    assert km.is_alive()
