from tests.api.harness import Service


async def test_rest_and_mcp_round_trip(service: Service, key: str) -> None:
    async with service.rest(key) as http:
        r = await http.post("/api/v1/conversations", json={"title": "t", "tags": ["a"]})
        assert r.status_code == 201, r.text
        cid = r.json()["conversation_id"]
        r = await http.post(
            "/api/v1/messages",
            json={
                "conversation_id": cid,
                "messages": [{"role": "user", "content": "my favourite colour is teal"}],
            },
        )
        assert r.status_code == 200, r.text
    async with service.mcp(key) as mcp:
        tools = await mcp.client.list_tools()
        assert len(tools.tools) == 6
        got = await mcp.ok("search", query="favourite colour teal")
        assert got["results"][0]["conversation_id"] == cid
