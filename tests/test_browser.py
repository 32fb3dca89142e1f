"""The course the way learners use it: JupyterLab in a real browser (Debian's chromium, driven by Playwright).

One JupyterLab server runs for this file, on 127.0.0.1 with no token, in a temporary folder holding copies of the
course notebooks (the committed ones are never touched), with TTLIB_FAST=1 in its environment so that every kernel
runs in fast mode, and with no DISPLAY (the notebooks must not need one). For each notebook of IN_BROWSER the
browser opens it, clicks Run > Run All Cells, waits until every code cell has run, saves it, and checks:

- no cell's output is an error (read from the saved notebook) and no traceback shows anywhere on the page (errors
  inside widget Outputs live only in the page);
- every widget view the kernel displayed is rendered (not "Loading widget..." or "Error displaying widget"), or
  was closed by the kernel (a finished tqdm bar), and at least one widget with a control (a slider...) shows;
- every image on the page has loaded (the plots).

IN_BROWSER is the front end's unit: a few quick notebooks that together display every kind of widget the course
displays (a test reads the kinds from every committed notebook's widget state, so a new kind elsewhere fails until
a notebook showing it is added here). That every notebook runs is nbval's (the README's test command runs
notebooks/), and that each displays a plot and a widget is tests/test_notebooks.py's; running the long notebooks
(06's episodes, 08's Ray cluster) here again proved nothing more about the browser.

A screenshot of each notebook goes to artifacts/browser/. One interaction is checked end to end (drag notebook
02's bins slider: the kernel redraws, the plot changes), and nbgrader's Validate button is clicked on a student
version made here by nbgrader's own preprocessors: the dialog must list the exercises' failing test cells.

Needs the `chromium` command (Debian: `apt-get install -y chromium`; .ci/run installs it). Without it these tests
fail -- they never skip. JupyterLab is stopped by its PID when the file's tests end, pass or fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# run here, in the browser: between them every kind of widget the course shows (see the module's docstring)
IN_BROWSER = [ROOT / "notebooks" / name for name in ("00_offline_rl_as_sequence_modeling.ipynb", "01_attention.ipynb",
                                                     "02_trajectory_tokenizer.ipynb", "05_beam_search.ipynb")]
ARTIFACTS = ROOT / "artifacts" / "browser"
RUN_ALL_TIMEOUT_S = 600  # fast mode: most notebooks take under a minute, 06 (full episodes) about 3; bounds a hang
VALIDATE_NOTEBOOK = "01_attention.ipynb"  # a quick one: nbgrader's Validate runs the whole notebook again
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "api/status", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer at {url} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    """Stop a process we started, by its PID: SIGTERM, then SIGKILL if it does not exit in time."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=20)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("the browser tests need Debian's chromium: run `apt-get install -y chromium` (.ci/run does). "
                    "No browser is downloaded.")
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server in a temporary folder: (base url, its root folder). Stopped by PID at the end."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "root"
    (root / "notebooks").mkdir(parents=True)
    for notebook in IN_BROWSER:
        shutil.copy(notebook, root / "notebooks" / notebook.name)
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # every cell in the DOM, so the page can be checked cell by cell; the notebook's own kernel starts without
    # asking (on a busy machine JupyterLab may otherwise ask to select one)
    (settings / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none", "autoStartDefaultKernel": True}))
    (settings.parent / "apputils-extension").mkdir()  # no "news?" pop-up over the screenshots
    (settings.parent / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    # one thread per kernel: the test command runs nbval beside this file on the same cores, and two OpenMP
    # threads per process spin-wait on each other (conftest.py sets the same under pytest-xdist)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(TTLIB_FAST="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
               JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               IPYTHONDIR=str(home / "ipython"))
    port = free_port()
    log = home / "jupyterlab.log"
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0", "--ServerApp.token=", "--IdentityProvider.token=",
               "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root}",
               "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    with open(log, "w") as log_file:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_server(url, process, log)
        yield url, root
    finally:
        stop(process)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / "jupyterlab.log")


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # launch() gives the browser a fresh, temporary profile of its own (Playwright's --user-data-dir)
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def shut_down_kernels(url: str) -> None:
    """End every notebook session (and its kernel), so that no kernel keeps the CPU busy after its test."""
    with urllib.request.urlopen(url + "api/sessions", timeout=30) as response:
        sessions = json.load(response)
    for session in sessions:
        request = urllib.request.Request(f"{url}api/sessions/{session['id']}", method="DELETE")
        urllib.request.urlopen(request, timeout=60).close()


@pytest.fixture
def page(browser, lab):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    console_errors = []
    page.on("pageerror", lambda error: console_errors.append(str(error)))
    page.console_errors = console_errors
    try:
        yield page
    finally:
        context.close()
        shut_down_kernels(lab[0])


# ---- driving JupyterLab ---------------------------------------------------------------------------------------
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook in front

CELL_STATE = """(() => {
    const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
    if (!panel) return null;
    const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
    const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
    return {prompts, status: indicator ? indicator.getAttribute('data-status') : null};
})"""


def open_notebook(page, url: str, path: str) -> None:
    page.goto(f"{url}lab/tree/{path}?reset")
    page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for(timeout=120_000)
    # the kernel is up when the toolbar's execution indicator says idle
    page.wait_for_function(
        "() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator')"
        "?.getAttribute('data-status') === 'idle'", timeout=120_000)
    page.wait_for_timeout(1000)
    select_kernel = page.locator(".jp-Dialog", has_text="Select Kernel")
    if select_kernel.count():  # should not happen with autoStartDefaultKernel; a learner would press Select
        select_kernel.get_by_role("button", name="Select").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0, timeout=30_000)


def click_run_all(page) -> None:
    page.locator(f"{NOTEBOOK} .jp-Notebook").click(position={"x": 5, "y": 5})  # the notebook is the current widget
    page.get_by_role("menuitem", name="Run", exact=True).click()
    run_all = page.get_by_role("menuitem", name="Run All Cells", exact=True)
    expect(run_all).not_to_have_attribute("aria-disabled", "true", timeout=60_000)
    run_all.click()


def run_all_cells(page) -> float:
    """Run > Run All Cells from the menu bar; wait until every code cell has run (or the run stopped on an error).

    Run All queues every code cell at once: the page shows [*] for each at once, before the kernel has run any. On a
    crowded machine (the grading tests' CPU hogs beside it) Run All has left every cell unrun beside an idle kernel,
    in a notebook opened after another (02 after 01, 05 after 02), or has run the first cell only and queued none
    of the others: if nothing is queued 15 s after the click, or the kernel goes idle with cells unrun, the test
    does what a learner would, and runs all again (twice at most; a screenshot each time, in artifacts/browser/).
    A run that stops on an error stops on it again, and the test names the error."""
    click_run_all(page)
    start = idle_since = time.monotonic()
    clicks = 1
    while True:
        state = page.evaluate(CELL_STATE)
        if any(p != "[ ]:" for p in state["prompts"]):
            break
        if state["status"] != "idle":
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 15 and clicks < 3:
            page.screenshot(path=str(ARTIFACTS / f"run_all_ran_nothing_{clicks}.png"))
            click_run_all(page)
            clicks, idle_since = clicks + 1, time.monotonic()
        if time.monotonic() - start > 300:
            page.screenshot(path=str(ARTIFACTS / "run_all_did_not_start.png"))
            raise TimeoutError(f"no cell started in 300 s after Run All (clicked {clicks} times)")
        time.sleep(0.5)
    settled = 0
    while time.monotonic() - start < RUN_ALL_TIMEOUT_S:
        state = page.evaluate(CELL_STATE)
        busy = state["status"] != "idle" or any(p.startswith("[*]") for p in state["prompts"])
        # a run that stops on an error leaves the later cells unrun: an idle kernel with nothing queued is the end
        settled = 0 if busy else settled + 1
        if settled >= 3 and "[ ]:" in state["prompts"] and clicks < 3:  # stopped early: on an error, or Run All
            page.screenshot(path=str(ARTIFACTS / f"run_all_stopped_early_{clicks}.png"))  # queued only the first
            click_run_all(page)  # again, as a learner would: an error stops the run again, and the test names it
            clicks, settled = clicks + 1, 0
        elif settled >= 3:
            return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError(f"cells still running after {RUN_ALL_TIMEOUT_S} s: {page.evaluate(CELL_STATE)['prompts']}")


def save(page, path: Path) -> nbformat.NotebookNode:
    """Save from the keyboard and read what JupyterLab wrote to disk."""
    before = path.stat().st_mtime_ns
    page.locator(f"{NOTEBOOK} .jp-Notebook").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 60
    while path.stat().st_mtime_ns == before:
        assert time.monotonic() < deadline, f"{path.name} was not saved"
        time.sleep(0.2)
    time.sleep(0.5)  # let the write finish
    return nbformat.read(path, as_version=4)


PAGE_STATE = """() => {
    const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
    const outputs = [...panel.querySelectorAll('.jp-OutputArea-output')];
    // a cell's own outputs (not those inside a widget's Output); a rendered widget view holds a .jupyter-widgets
    const widgetViews = outputs.filter(o => !o.parentElement.closest('.jupyter-widgets')
                                            && o.querySelector(':scope > .jupyter-widgets'));
    return {
        tracebacks: outputs.filter(o => o.dataset.mimeType === 'application/vnd.jupyter.stderr'
                                        && /Traceback|Error\\b.*:/.test(o.textContent))
                           .map(o => o.textContent.slice(0, 2000)),
        stderr: outputs.filter(o => o.dataset.mimeType === 'application/vnd.jupyter.stderr')
                       .map(o => o.textContent.slice(0, 300)),
        widgetViews: widgetViews.length,
        // a widget closed by the kernel (e.g. a tqdm bar with leave=False) leaves its output empty
        closedWidgetViews: outputs.filter(o => !o.parentElement.closest('.jupyter-widgets') && !o.dataset.mimeType
                                               && o.childElementCount === 0).length,
        controls: widgetViews.filter(o => o.querySelector(
            '.widget-slider, .widget-dropdown, .widget-toggle-buttons, .widget-button, .widget-checkbox')).length,
        widgetProblems: outputs.filter(o => /Error displaying widget|Loading widget/.test(o.textContent))
                               .map(o => o.textContent.slice(0, 300)),
        sliders: panel.querySelectorAll('.widget-slider').length,
        images: [...panel.querySelectorAll('.jp-OutputArea-output img')]
                  .map(img => ({loaded: img.complete && img.naturalWidth > 0, width: img.naturalWidth})),
    };
}"""


def screenshot(page, name: str) -> Path:
    """The notebook from top to bottom in one picture (the viewport grown to the notebook's height)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    scroller = f"document.querySelector('{NOTEBOOK} .jp-WindowedPanel-outer')"
    height = page.evaluate(f"() => {scroller}.scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 200, 16_000)})
    page.evaluate(f"() => {{ {scroller}.scrollTop = 0; }}")
    page.wait_for_timeout(1000)
    target = ARTIFACTS / f"{Path(name).stem}.png"
    page.screenshot(path=str(target))
    page.set_viewport_size({"width": 1400, "height": 1000})
    return target


def widget_views_in(nb) -> int:
    return sum("application/vnd.jupyter.widget-view+json" in output.get("data", {})
               for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs)


# ---- the tests ------------------------------------------------------------------------------------------------
def widget_kinds(path: Path) -> set[str]:
    """The kinds of widget (ipywidgets' model names: IntSliderModel, FloatProgressModel, ...) in a committed
    notebook's saved widget state: what its full run displayed."""
    saved = nbformat.read(path, as_version=4).metadata.get("widgets", {})
    state = saved.get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return {widget["model_name"] for widget in state.values()}


def test_the_notebooks_run_here_show_every_kind_of_widget_the_course_shows():
    shown = {path.name: widget_kinds(path) for path in NOTEBOOKS}
    unsaved = [name for name, kinds in shown.items() if not kinds]
    assert not unsaved, f"committed notebooks without saved widget state (rerun tools.outputs): {unsaved}"
    here = set().union(*(shown[path.name] for path in IN_BROWSER))
    missing = {name: sorted(kinds - here) for name, kinds in shown.items() if kinds - here}
    assert not missing, f"widgets no notebook of IN_BROWSER shows (add one that does): {missing}"


def test_chromium_is_installed(chromium):
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True, timeout=60)
    assert "Chromium" in version.stdout, version.stdout + version.stderr


@pytest.mark.parametrize("notebook", IN_BROWSER, ids=[p.stem for p in IN_BROWSER])
def test_notebook_runs_in_jupyterlab(notebook, lab, page):
    url, root = lab
    path = root / "notebooks" / notebook.name
    open_notebook(page, url, f"notebooks/{notebook.name}")
    seconds = run_all_cells(page)
    saved = save(page, path)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / "timings.txt", "a") as timings:
        timings.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {notebook.name}: run all cells {seconds:.1f} s\n")

    errors = [(i, o.get("ename"), o.get("evalue")) for i, cell in enumerate(saved.cells) if cell.cell_type == "code"
              for o in cell.outputs if o.output_type == "error"]
    assert errors == [], f"error outputs (cell, type, message): {errors}"
    unrun = [i for i, cell in enumerate(saved.cells) if cell.cell_type == "code" and cell.execution_count is None]
    assert unrun == [], f"cells that did not run: {unrun}"

    state = page.evaluate(PAGE_STATE)
    shot = screenshot(page, notebook.name)
    assert state["tracebacks"] == [], f"tracebacks on the page (see {shot}): {state['tracebacks']}"
    assert state["widgetProblems"] == [], f"widgets not rendered: {state['widgetProblems']}"
    expected_views = widget_views_in(saved)
    assert expected_views >= 1, "the notebook displays at least one widget"
    assert state["widgetViews"] + state["closedWidgetViews"] == expected_views, (
        f"{expected_views} widget views displayed; on the page {state['widgetViews']} rendered, "
        f"{state['closedWidgetViews']} closed by the kernel")
    assert state["controls"] >= 1, "no widget with a control (slider, dropdown, buttons) is rendered"
    if re.search(r"widgets\.\w*Slider\(", "\n".join(c.source for c in saved.cells if c.cell_type == "code")):
        assert state["sliders"] >= 1, "a slider is displayed but none is on the page"
    assert state["images"], "no image on the page: the plots did not render"
    assert all(image["loaded"] for image in state["images"]), f"images that did not load: {state['images']}"
    assert page.console_errors == [], f"JavaScript errors on the page: {page.console_errors}"
    if notebook.name in INTERACTIONS:
        INTERACTIONS[notebook.name](page)


def drag_the_bins_slider(page) -> None:
    """Notebook 02's bins slider: drag it to few bins, the kernel redraws the histogram with other bin edges."""
    bins = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="bins"))
    explorer = page.locator(f"{NOTEBOOK} .jp-OutputArea-output", has=bins)  # the cell's output: sliders + plot
    slider = explorer.locator(".widget-slider", has=page.locator(".widget-label", has_text="bins"))
    plot = explorer.locator(".widget-output img")
    readout = slider.locator(".widget-readout")
    slider.scroll_into_view_if_needed()
    before_value, before_plot = readout.inner_text(), plot.get_attribute("src")
    assert before_value == "100" and before_plot

    handle = slider.locator(".noUi-handle").bounding_box()
    track = slider.locator(".noUi-target").bounding_box()
    page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
    page.mouse.down()
    page.mouse.move(track["x"] + 0.1 * track["width"], handle["y"] + handle["height"] / 2, steps=10)
    page.mouse.up()

    deadline = time.monotonic() + 60
    while plot.count() == 0 or plot.get_attribute("src") == before_plot:
        assert time.monotonic() < deadline, "the plot did not change after the slider moved"
        time.sleep(0.3)
    after_value = int(readout.inner_text())
    assert 5 <= after_value < 50, f"the slider should have moved to few bins, reads {after_value}"
    explorer.screenshot(path=str(ARTIFACTS / f"02_bins_slider_at_{after_value}.png"))
    assert page.evaluate(PAGE_STATE)["tracebacks"] == []


# a widget used end to end, after the notebook has run (in the same page, so the notebook runs once)
INTERACTIONS = {"02_trajectory_tokenizer.ipynb": drag_the_bins_slider}


def test_nbgrader_validate_button(lab, page):
    """A student version (made by nbgrader's own preprocessors) fails Validate on every exercise's test cell."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions, ComputeChecksums, LockCells

    url, root = lab
    solution = nbformat.read(ROOT / "notebooks" / VALIDATE_NOTEBOOK, as_version=4)
    student = nbformat.from_dict(json.loads(json.dumps(solution)))
    for preprocessor in (LockCells(), ClearSolutions(), ClearOutput(), ClearHiddenTests(), ComputeChecksums()):
        student, _ = preprocessor.preprocess(student, {})
    (root / "student").mkdir(exist_ok=True)
    nbformat.write(student, root / "student" / VALIDATE_NOTEBOOK)
    n_tests = sum(1 for c in solution.cells if c.metadata.get("nbgrader", {}).get("grade"))
    assert "raise NotImplementedError()" in "\n".join(c.source for c in student.cells)

    open_notebook(page, url, f"student/{VALIDATE_NOTEBOOK}")
    page.locator(f"{NOTEBOOK} .validate-button").click()
    dialog = page.locator(".jp-Dialog", has_text="Validation Results")
    dialog.wait_for(timeout=RUN_ALL_TIMEOUT_S * 1000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "validate_student_version.png"))
    body = dialog.inner_text()
    assert dialog.locator(".validation-failed").count() == 1, body[:3000]
    assert body.count("The following cell failed:") == n_tests, body[:3000]
    assert "NotImplementedError" in body
