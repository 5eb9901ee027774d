"""The web page in a real browser: headless Chromium driven by Selenium against `rill serve`
(rill-tiny) on 127.0.0.1 with an ephemeral port. Chat over SSE, type-ahead over /v1/realtime
(seen arriving on the server before Enter), the stop button freeing the request, tool calls,
the API key prompt, keyboard use and a phone-sized screen.

Needs the `web` extra (selenium) and Debian's chromium and chromium-driver; without them these
tests skip, unless RILL_BROWSER_TESTS=required (CI sets it), which makes a skip a failure.
RILL_WEB_SCREENSHOT=PATH saves the README's screenshot there (default: the test's tmp dir).
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from helpers_browser import browser_requirements, chromium
from helpers_browser import rill_serve as serve_subprocess

QUESTION = "What is 12 + 30?"
SERVE_TIMEOUT_S = 120
ANSWER_TIMEOUT_S = 60


_MISSING, pytestmark = browser_requirements()

if _MISSING is None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait


# -- the server and the browser -------------------------------------------------------------------------------


def rill_serve(tmp_path: Path, *flags: str):
    """`rill serve` (rill-tiny and rill-tiny-vision) on a free port: yields its URL (helpers_browser.rill_serve)."""
    return serve_subprocess(tmp_path, "--speech-model", "none", *flags, timeout_s=SERVE_TIMEOUT_S)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with rill_serve(tmp_path_factory.mktemp("serve")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium("--force-device-scale-factor=1") as driver:
        yield driver


def open_page(browser, url: str):
    browser.get(url)
    browser.get_log("browser")  # start each test's console afresh
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"), "the model list")
    return browser


def wait(browser, condition, what: str, timeout_s: float = ANSWER_TIMEOUT_S):
    return WebDriverWait(browser, timeout_s, poll_frequency=0.05).until(condition, f"waited {timeout_s} s for {what}")


def console_errors(browser) -> list[dict]:
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def metrics(url: str) -> dict[str, float]:
    """The server's samples straight from /metrics (not through the page), summed over label sets as the page
    sums them: with rill-tiny-vision served too, every series carries `model_name`."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r"(?m)^(rill_\w+)(?:\{[^}]*\})? (\S+)$", text):
        out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def wait_for_metric(url: str, condition, what: str, timeout_s: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition(sample := metrics(url)):
            return sample
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout_s} s for {what}: {metrics(url)}")


def set_field(browser, element_id: str, value: str) -> None:
    field = browser.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(value)


def set_checked(browser, element_id: str, checked: bool) -> None:
    box = browser.find_element(By.ID, element_id)
    if box.is_selected() != checked:
        box.click()


def last_answer(browser, timeout_s: float = ANSWER_TIMEOUT_S):
    """The last answer once its stats line is there: (content, stats)."""
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#log li.assistant:last-child .stats"), "an answer",
         timeout_s)
    item = browser.find_element(By.CSS_SELECTOR, "#log li.assistant:last-child")
    return item.find_element(By.CSS_SELECTOR, ".content").text, item.find_element(By.CSS_SELECTOR, ".stats").text


def screenshot_path(tmp_path: Path) -> Path:
    return Path(os.environ.get("RILL_WEB_SCREENSHOT", tmp_path / "web-page.png"))


# -- tests ------------------------------------------------------------------------------------------------------


def test_page_loads_without_console_errors_and_labels_every_control(server, browser):
    open_page(browser, server)
    assert browser.title == "rill"
    # `rill serve` with no model serves what the package ships; the page picks the first
    models = [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#model option")]
    assert models == ["rill-tiny", "rill-tiny-vision"]
    assert Select(browser.find_element(By.ID, "model")).first_selected_option.text == "rill-tiny"
    wait(browser, lambda d: d.find_element(By.ID, "m-running").text == "0", "the metrics panel")
    unlabelled = browser.execute_script(
        "return [...document.querySelectorAll('input, select, textarea')].filter(e => !e.labels.length)"
        ".map(e => e.id)")
    assert unlabelled == []
    assert console_errors(browser) == []


def test_a_typed_question_gets_a_streamed_answer_over_sse(server, browser):
    open_page(browser, server)
    set_checked(browser, "typeahead", False)
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys(QUESTION, Keys.ENTER)
    content, stats = last_answer(browser)
    assert "42" in content
    assert re.search(r"\d+ tokens · first token \d+ ms after Enter · \d+ tokens/s · via SSE", stats), stats
    assert browser.find_element(By.CSS_SELECTOR, "#log li.user .content").text == QUESTION
    assert prompt.get_attribute("value") == ""
    assert console_errors(browser) == []


def test_type_ahead_streams_the_text_before_enter_and_resends_after_an_edit(server, browser, tmp_path):
    open_page(browser, server)
    before = metrics(server)
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys("What is 12 + 31")
    # Before Enter: the server holds a realtime connection and has counted the typed tokens as prompt.
    wait_for_metric(server, lambda m: m["rill_realtime_connections_open"] == 1
                    and m["rill_prompt_tokens_total"] > before["rill_prompt_tokens_total"], "the typed text")
    status = browser.find_element(By.ID, "typeahead-status")
    wait(browser, lambda d: status.get_attribute("data-sent") == str(len("What is 12 + 31")), "the page's count")
    prompt.send_keys(Keys.BACKSPACE, "0?")  # an edit: the page closes that session and sends the text anew
    wait(browser, lambda d: status.get_attribute("data-sent") == str(len(QUESTION)), "the edited text resent")
    sent = wait_for_metric(server, lambda m: m["rill_realtime_connections_open"] == 1, "the new connection")
    prompt.send_keys(Keys.ENTER)
    content, stats = last_answer(browser)
    assert "42" in content
    match = re.search(r"first token (\d+) ms after Enter · .* via realtime, type-ahead", stats)
    assert match, stats
    assert sent["rill_prompt_tokens_total"] > before["rill_prompt_tokens_total"]
    wait_for_metric(server, lambda m: m["rill_realtime_connections_open"] == 0, "the message's connection to close")
    browser.save_screenshot(str(screenshot_path(tmp_path)))
    assert console_errors(browser) == []


@pytest.mark.parametrize("how", ["button", "escape"])
def test_stop_ends_a_long_answer_and_the_running_gauge_returns_to_0(server, browser, how):
    open_page(browser, server)
    set_checked(browser, "typeahead", False)
    set_field(browser, "max-tokens", "20000")
    set_field(browser, "extra", '{"ignore_eos": true}')  # rill-tiny stops early otherwise
    browser.find_element(By.ID, "prompt").send_keys("Tell me a long story.", Keys.ENTER)
    wait(browser, lambda d: len(d.find_element(By.CSS_SELECTOR, "#log li.assistant .content").text) > 40,
         "the long answer to stream")
    assert metrics(server)["rill_num_requests_running"] == 1
    if how == "button":
        browser.find_element(By.ID, "stop").click()
    else:
        browser.switch_to.active_element.send_keys(Keys.ESCAPE)
    content, stats = last_answer(browser, 10)
    assert stats.endswith("stopped"), stats
    wait_for_metric(server, lambda m: m["rill_num_requests_running"] == 0 and m["rill_num_requests_waiting"] == 0,
                    "the running gauge to return to 0", 10)
    assert browser.switch_to.active_element.get_attribute("id") == "prompt"  # not the disabled Stop
    errors = console_errors(browser)
    assert errors == [], errors


@pytest.mark.parametrize("typeahead", [False, True], ids=["sse", "realtime"])
def test_a_tool_call_is_shown_as_a_call(server, browser, typeahead):
    open_page(browser, server)
    set_checked(browser, "typeahead", typeahead)
    set_checked(browser, "tools", True)
    browser.find_element(By.ID, "prompt").send_keys("What's the weather in Tokyo?", Keys.ENTER)
    last_answer(browser)
    call = browser.find_element(By.CSS_SELECTOR, "#log li.assistant .tool-call")
    assert call.get_attribute("role") == "group"
    assert re.fullmatch(r'Tool call\nget_weather\(\{"city": ?"Tokyo"\}\)', call.text), call.text
    assert console_errors(browser) == []


def test_reasoning_is_folded_and_text_is_never_html(server, browser):
    """The page's own modules in the browser: a reasoning delta goes into a closed <details>."""
    open_page(browser, server)
    result = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import("./web/conversation.js").then(({ Conversation }) => {
          const list = document.createElement("ol");
          const view = new Conversation(list).startAnswer(performance.now(), "test");
          view.reasoning("12 + 30: add the tens");
          view.text("<b>42</b>");
          view.finish({ tokens: 3, status: "stop" });
          const details = list.querySelector("details");
          done([details.open, details.querySelector("summary").textContent,
                details.textContent, list.querySelector(".content").innerHTML]);
        });""")
    assert result == [False, "Reasoning", "Reasoning12 + 30: add the tens", "&lt;b&gt;42&lt;/b&gt;"]


def test_the_page_modules_parse_sse_and_metrics_and_replay_the_conversation(server, browser):
    open_page(browser, server)
    result = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        Promise.all([import("./web/sse.js"), import("./web/metrics.js"), import("./web/typeahead.js")])
          .then(([sse, metrics, typeahead]) => {
            const split = sse.splitFrames('data: {"a":1}\\r\\n\\r\\nevent: error\\ndata: x\\n\\ndata: [DO');
            const values = metrics.parseMetrics('# HELP x\\nrill_num_requests_running 2.0\\nh_bucket{le="1"} 3\\n');
            const events = typeahead.setupEvents({ model: "m", temperature: 0, maxTokens: 8, system: "",
              tools: false, history: [{ role: "user", content: "hi" }, { role: "assistant", content: "yo" }] });
            done([split.frames, split.rest, values.get("rill_num_requests_running"), values.get("h_bucket"),
                  events.map((e) => e.type + ":" + (e.item?.role ?? ""))]);
          });""")
    frames, rest, running, bucket, events = result
    assert frames == [{"event": "message", "data": '{"a":1}'}, {"event": "error", "data": "x"}]
    assert rest == "data: [DO" and running == 2 and bucket == 3
    assert events == ["session.update:", "conversation.item.create:user", "conversation.item.create:assistant"]


def test_keyboard_alone_reaches_every_control_in_reading_order(server, browser):
    open_page(browser, server)
    browser.execute_script("document.querySelector('.skip').focus()")  # the first stop of Tab
    order = []
    for _ in range(16):
        browser.switch_to.active_element.send_keys(Keys.TAB)
        active = browser.switch_to.active_element
        order.append(active.get_attribute("id") or active.tag_name)
    expected = ["prompt", "send", "new-chat", "summary", "model", "temperature", "max-tokens", "system", "typeahead",
                "tools", "extra"]
    positions = [order.index(name) for name in expected]
    assert positions == sorted(positions), order
    assert "stop" not in order  # disabled until an answer streams
    browser.execute_script("document.querySelector('.skip').focus()")
    browser.switch_to.active_element.send_keys(Keys.ENTER)  # the skip link lands in the message box
    assert browser.switch_to.active_element.get_attribute("id") == "prompt"


def test_a_phone_sized_screen_needs_no_sideways_scrolling(server, browser):
    browser.set_window_size(390, 844)
    try:
        open_page(browser, server)
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        assert not browser.find_element(By.ID, "model").is_displayed()  # Settings start folded on a phone
        browser.find_element(By.CSS_SELECTOR, "#settings-panel summary").click()
        for element_id in ("prompt", "send", "model"):
            box = browser.find_element(By.ID, element_id).rect
            assert 0 <= box["x"] and box["x"] + box["width"] <= 390, (element_id, box)
        assert browser.find_element(By.ID, "send").rect["height"] >= 44  # a finger-sized target
    finally:
        browser.set_window_size(1100, 760)


def test_with_an_api_key_the_page_asks_for_it_and_uses_it_for_sse_and_realtime(browser, tmp_path):
    with rill_serve(tmp_path, "--api-key", "sesame") as url:
        browser.get(url)
        dialog = browser.find_element(By.ID, "key-dialog")
        wait(browser, lambda d: dialog.is_displayed(), "the key dialog")
        browser.find_element(By.ID, "key").send_keys("wrong", Keys.ENTER)
        wait(browser, lambda d: "refused" in d.find_element(By.ID, "key-error").text, "the refusal")
        key = browser.find_element(By.ID, "key")
        key.clear()
        key.send_keys("sesame", Keys.ENTER)
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"), "the model list")
        assert browser.execute_script("return sessionStorage.getItem('rill.apiKey')") == "sesame"
        prompt = browser.find_element(By.ID, "prompt")
        for typeahead, via in ((True, "via realtime, type-ahead"), (False, "via SSE")):
            set_checked(browser, "typeahead", typeahead)
            prompt.send_keys(QUESTION, Keys.ENTER)
            wait(browser, lambda d: via in d.find_elements(By.CSS_SELECTOR, "#log li.assistant .stats")[-1].text
                 if d.find_elements(By.CSS_SELECTOR, "#log li.assistant .stats") else False, f"an answer {via}")
            assert "42" in browser.find_elements(By.CSS_SELECTOR, "#log li.assistant .content")[-1].text
        errors = [e for e in console_errors(browser) if "401" not in e["message"]]  # the refused key's 401
        assert errors == []
        browser.execute_script("sessionStorage.clear()")
