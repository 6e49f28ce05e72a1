"""The playground at / in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, installed where missing) driven by selenium, against a server with --api-key.

Oracles: the fake engine's greedy formula (`expected_greedy_text`) for the answer the page shows;
the text seen while the answer streams is a growing prefix of it (streamed, not shown at once);
the figures the page computes are the ones its request implies (tokens = max_tokens, finish
"length"); the server gauges read from /metrics. The page's own files are checked for relative
URLs and nothing fetched from elsewhere, and the browser test runs both straight and through a
reverse proxy that serves the server under a path prefix. `TGSERVE_PLAYGROUND_SCREENSHOT=path`
saves the page as the README shows it.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time

import httpx
import pytest
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.debian_tools import debian_tool
from tests.server.fake_engine import FakeEngine, FakeTokenizer, expected_greedy_text
from tests.server.live import LiveServer, free_port

KEY = "secret"
PROMPT = "Tell me a story"
MAX_TOKENS = 40
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,800",
)  # fmt: skip


@pytest.fixture(scope="module")
def engines():
    """The fake engines the server built (one): a test holds its steps with `stall`."""
    return []


@pytest.fixture(scope="module")
def server(engines):
    def engine():
        engines.append(FakeEngine(step_delay=0.05))  # 40 tokens stream over ~2 s
        return engines[-1]

    with LiveServer(engine, api_key=(KEY,)) as live:
        yield live


PREFIX = "/tgserve"


def prefix_proxy(upstream: str):
    """An ASGI reverse proxy that serves `upstream` under PREFIX (streams pass through)."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if not scope["path"].startswith(PREFIX + "/"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            return await send({"type": "http.response.body", "body": b""})
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        url = upstream + scope["path"][len(PREFIX) :]
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"host", b"content-length")]
        async with httpx.AsyncClient(timeout=60) as client:
            request = client.build_request(scope["method"], url, headers=headers, content=body)
            response = await client.send(request, stream=True)
            skip = {"content-length", "transfer-encoding", "connection"}
            kept = [(k.encode(), v.encode()) for k, v in response.headers.items() if k not in skip]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": kept}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


@pytest.fixture(scope="module")
def proxied(server):
    """The server's URL under PREFIX, through `prefix_proxy`."""
    port = free_port()
    config = uvicorn.Config(
        prefix_proxy(server.url), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    proxy = uvicorn.Server(config)
    thread = threading.Thread(target=proxy.run, daemon=True)
    thread.start()
    wait_for(lambda: proxy.started, what="the proxy")
    yield f"http://127.0.0.1:{port}{PREFIX}"
    proxy.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = debian_tool("chromium", "chromium")
    driver_path = debian_tool("chromedriver", "chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    yield driver
    driver.quit()


def wait_for(condition, timeout: float = 20.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_page_and_its_files_load_without_a_key_from_relative_urls(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(urls) == [
        "static/playground/app.js",
        "static/playground/icon.svg",  # the favicon: no request for a missing /favicon.ico
        "static/playground/style.css",
    ]
    script = httpx.get(server.url + "/static/playground/app.js").text
    assert httpx.get(server.url + "/static/playground/style.css").status_code == 200
    icon = httpx.get(server.url + "/static/playground/icon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    fetched = re.findall(r'fetch\("([^"]+)"', script)
    assert fetched and all(not re.match(r"[a-z]+:|/", url) for url in fetched), fetched
    assert httpx.post(server.url + "/", json={"inputs": "x"}).status_code == 401  # TGI: keyed
    assert httpx.get(server.url + "/static/playground/nothing.js").status_code == 404


def open_page(browser, url: str):
    """The page at `url`, given the key; returns the model label element."""
    browser.get(url + "/")
    model = browser.find_element(By.ID, "model")
    wait_for(lambda: "API key" in model.text, what="the page to ask for the key")
    browser.find_element(By.ID, "api-key").send_keys(KEY, Keys.TAB)  # "change" fires on blur
    wait_for(lambda: model.text == "model: fake-model", what="/info with the key")
    return model


def set_field(browser, field: str, value: str) -> None:
    element = browser.find_element(By.ID, field)
    element.clear()
    element.send_keys(value)


def bubbles(browser) -> list[tuple[str, str]]:
    """(classes, text) of every bubble in the conversation, read at one instant."""
    script = (
        "return [...document.querySelectorAll('#messages .message')]"
        ".map((node) => [node.className, node.innerText])"
    )
    return [tuple(pair) for pair in browser.execute_script(script)]


def test_a_failed_turn_leaves_an_error_in_the_conversation_and_no_bubbles(server, browser):
    open_page(browser, server.url)
    set_field(browser, "max_tokens", "0")  # the server answers 400 naming max_tokens
    browser.find_element(By.ID, "prompt").send_keys(PROMPT, Keys.ENTER)
    wait_for(lambda: any("error" in c for c, _ in bubbles(browser)), what="the error")
    ((classes, text),) = bubbles(browser)  # the failed turn's question and answer are gone
    assert "error" in classes and "400" in text and "max_tokens" in text
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == PROMPT  # to retry
    set_field(browser, "max_tokens", "3")
    set_field(browser, "temperature", "0")
    browser.find_element(By.ID, "prompt").send_keys(Keys.ENTER)
    wait_for(lambda: browser.find_element(By.ID, "finish").text == "length", what="the answer")
    shown = bubbles(browser)  # the retry alone: the error went with the new question
    assert [c.split()[-1] for c, _ in shown] == ["user", "assistant"], shown
    chat = [{"role": "user", "content": PROMPT}]  # the failed turn is not in the history sent
    expected = expected_greedy_text(list(FakeTokenizer().apply_chat_template(chat).encode()), 3)
    assert shown[1][1].endswith(expected.strip())
    browser.find_element(By.ID, "clear").click()


def test_the_answer_shows_a_waiting_indicator_until_its_first_token(server, engines, browser):
    open_page(browser, server.url)
    set_field(browser, "max_tokens", "3")
    engines[0].stall.set()  # no step runs: no token comes
    try:
        browser.find_element(By.ID, "prompt").send_keys(PROMPT, Keys.ENTER)
        waiting = wait_for(
            lambda: browser.find_elements(By.CSS_SELECTOR, ".message.assistant.waiting .content"),
            what="the waiting indicator",
        )
        shown = browser.execute_script(
            "return getComputedStyle(arguments[0], '::after').content", waiting[0]
        )
        assert "…" in shown
    finally:
        engines[0].stall.clear()
    wait_for(lambda: browser.find_element(By.ID, "finish").text == "length", what="the answer")
    assert not browser.find_elements(By.CSS_SELECTOR, ".message.waiting")
    browser.find_element(By.ID, "clear").click()


@pytest.mark.parametrize("behind_a_prefix", [False, True])
def test_a_prompt_streams_its_answer_and_the_figures_follow(
    server, proxied, browser, tmp_path, behind_a_prefix
):
    open_page(browser, proxied if behind_a_prefix else server.url)
    for field, value in (("temperature", "0"), ("max_tokens", str(MAX_TOKENS))):
        set_field(browser, field, value)
    browser.find_element(By.ID, "prompt").send_keys(PROMPT, Keys.ENTER)

    chat = [{"role": "user", "content": PROMPT}]
    expected = expected_greedy_text(
        list(FakeTokenizer().apply_chat_template(chat).encode()), MAX_TOKENS
    )
    seen = set()

    def answered() -> bool:
        shown = browser.find_elements(By.CSS_SELECTOR, ".message.assistant .content")
        text = shown[-1].text if shown else ""
        seen.add(text.strip())  # an edge's space is kept or trimmed as the layout falls
        return text.strip() == expected.strip()

    try:
        wait_for(answered, what="the whole answer")
    except AssertionError:
        print("DEBUG", bubbles(browser), browser.get_log("browser"))
        raise
    partial = {text for text in seen if text and text != expected.strip()}
    assert len(partial) >= 2 and all(expected.startswith(text) for text in partial), partial
    finish = browser.find_element(By.ID, "finish")
    wait_for(lambda: finish.text == "length", what="the finish reason")
    tokens = browser.find_element(By.ID, "tokens")  # the usage chunk comes after the finish
    wait_for(lambda: tokens.text == str(MAX_TOKENS), what="the usage's token count")
    assert re.fullmatch(r"\d+\.\d{3} s", browser.find_element(By.ID, "ttft").text)
    assert float(browser.find_element(By.ID, "tps").text) > 0
    kv = browser.find_element(By.ID, "kv")
    wait_for(lambda: "%" in kv.text, what="the KV gauge from /metrics")
    assert browser.find_element(By.ID, "running").text.isdigit()
    assert browser.find_element(By.ID, "waiting").text.isdigit()
    screenshot = tmp_path / "playground.png"
    assert browser.save_screenshot(str(screenshot))
    target = os.environ.get("TGSERVE_PLAYGROUND_SCREENSHOT")
    if target and not behind_a_prefix:
        shutil.copyfile(screenshot, target)
