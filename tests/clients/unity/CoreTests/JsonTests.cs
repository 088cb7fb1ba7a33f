using System;
using System.Collections.Generic;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>The client's own JSON reader and writer, and the request mapping built on them.</summary>
    public static class JsonTests
    {
        public static void Register()
        {
            TestRunner.Add("json_round_trips_text_numbers_and_nesting", RoundTrip);
            TestRunner.Add("json_refuses_what_is_not_json", Refuses);
            TestRunner.Add("requests_map_to_protobuf_json", RequestMapping);
            TestRunner.Add("tool_requests_and_calls_map_to_protobuf_json", ToolMapping);
            TestRunner.Add("budget_table_prefers_scene_then_quality", BudgetTableChoice);
            TestRunner.Add("launcher_quotes_arguments_for_the_command_line", Quoting);
        }

        static Task RoundTrip()
        {
            var text = "{\"a\":\"h\\u00e9llo \\\"q\\\" \\\\ \\n \\ud83d\\ude00\",\"n\":[1,-2.5,1e3,null,true,false],\"o\":{\"big\":\"18446744073709551615\"}}";
            var parsed = Json.ParseObject(text);
            Check.Equal("h\u00e9llo \"q\" \\ \n \U0001F600", parsed.GetString("a"), "escapes and a surrogate pair");
            var n = parsed.GetArray("n");
            Check.Equal(6, n.Count, "array length");
            Check.Equal(-2.5, (double)n[1], "negative fraction");
            Check.Equal(1000.0, (double)n[2], "exponent");
            Check.True(n[3] == null && (bool)n[4] && !(bool)n[5], "null and booleans");
            Check.Equal(ulong.MaxValue, parsed.GetObject("o").GetUInt64("big"), "uint64 as a string is exact");
            // Written back and read again it is the same value.
            var again = Json.ParseObject(Json.Write(parsed));
            Check.Equal(parsed.GetString("a"), again.GetString("a"), "round trip of the string");
            Check.Equal("\"\\u0001\uFFFD\"", Json.Write("\u0001\ud800"), "control characters escaped, a lone surrogate replaced");
            Check.Equal("{\"b\":\"AAEC\"}", Json.Write(new JsonObject { { "b", new byte[] { 0, 1, 2 } } }), "bytes as base64");
            Check.Equal("0.1", Json.Write(0.1), "doubles in invariant culture, shortest form");
            Check.Equal(0u, new JsonObject().GetUInt32("missing"), "a missing field reads as its default");
            return Task.FromResult(0);
        }

        static Task Refuses()
        {
            foreach (var bad in new[] { "", "{", "[1,]", "{\"a\" 1}", "\"unterminated", "tru", "{} x", "[\"\\x\"]", "01a" })
            {
                try
                {
                    Json.Parse(bad);
                    throw new AssertionFailed("accepted " + bad);
                }
                catch (FormatException)
                {
                }
            }
            var deep = new string('[', Json.MaxDepth + 5) + new string(']', Json.MaxDepth + 5);
            try
            {
                Json.Parse(deep);
                throw new AssertionFailed("accepted nesting deeper than the limit");
            }
            catch (FormatException)
            {
            }
            return Task.FromResult(0);
        }

        static Task RequestMapping()
        {
            var request = new GenerateRequest
            {
                Messages = new List<ChatMessage> { ChatMessage.System("be brief"), ChatMessage.User("hi") },
                Sampling = new SamplingParams { Temperature = 0, Seed = 12345678901234567UL },
                MaxTokens = 8,
                SessionId = "npc",
                Stop = new List<string> { "\n" },
            }.ToJson();
            Check.Equal("{\"messages\":{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"}]}," +
                        "\"sampling\":{\"temperature\":0,\"seed\":\"12345678901234567\"},\"maxTokens\":8,\"stop\":[\"\\n\"],\"sessionId\":\"npc\"}",
                Json.Write(request), "GenerateRequest in the canonical mapping");
            try
            {
                new GenerateRequest { Prompt = "x", Messages = new List<ChatMessage> { ChatMessage.User("y") } }.ToJson();
                throw new AssertionFailed("accepted both a prompt and messages");
            }
            catch (ArgumentException)
            {
            }
            var image = new AskImageRequest
            {
                Question = "what?",
                Image = ImageInput.FromRaw(new RawImage { Pixels = new byte[] { 1, 2, 3, 4 }, Width = 1, Height = 1, BottomUp = true }),
            }.ToJson();
            Check.Equal("{\"question\":\"what?\",\"image\":{\"raw\":{\"pixels\":\"AQIDBA==\",\"width\":1,\"height\":1,\"format\":\"PIXEL_FORMAT_RGBA8\",\"bottomUp\":true}}}",
                Json.Write(image), "AskImageRequest with raw RGBA8 pixels");
            Check.Equal("{\"vramSize\":\"2G\",\"maxCpuThreads\":3}", Json.Write(SetBudgetRequest.Vram("2G", 3).ToJson()), "SetBudgetRequest");
            Check.Equal("{\"autoReserveBytes\":\"1073741824\"}", Json.Write(SetBudgetRequest.FollowFreeVram(1UL << 30).ToJson()), "auto VRAM");
            return Task.FromResult(0);
        }

        static Task ToolMapping()
        {
            const string schema = "{\"type\":\"object\",\"properties\":{\"target\":{\"type\":\"string\"}},\"required\":[\"target\"]}";
            var tools = new List<ToolDefinition> { new ToolDefinition("attack", "attack a target", schema), new ToolDefinition("flee") };
            var request = new GenerateRequest { Messages = new List<ChatMessage> { ChatMessage.User("a thief!") }, Tools = tools, ToolChoice = ToolChoice.Function("flee") };
            Check.Equal("{\"messages\":{\"messages\":[{\"role\":\"user\",\"content\":\"a thief!\"}]}," +
                        "\"tools\":[{\"name\":\"attack\",\"description\":\"attack a target\",\"parametersJsonSchema\":" + Json.Write(schema) + "}," +
                        "{\"name\":\"flee\"}],\"toolChoice\":\"flee\"}",
                Json.Write(request.ToJson()), "tools and a named tool_choice");
            Check.Equal("required", ToolChoice.Required.Value, "required");
            Check.Equal("auto", ToolChoice.Auto.Value, "auto");
            Check.Equal("none", ToolChoice.None.Value, "none");
            request.ToolChoice = null;
            Check.True(!request.ToJson().ContainsKey("toolChoice"), "no tool_choice: the daemon's default (required)");
            try
            {
                new GenerateRequest { Prompt = "x", Tools = new List<ToolDefinition> { new ToolDefinition("") } }.ToJson();
                throw new AssertionFailed("accepted a tool without a name");
            }
            catch (ArgumentException)
            {
            }

            var final = GenerationFinal.FromJson(Json.ParseObject(
                "{\"finishReason\":\"FINISH_REASON_TOOL_CALL\",\"toolCall\":{\"name\":\"attack\",\"argumentsJson\":\"{\\\"target\\\": \\\"thief\\\"}\"}}"));
            Check.Equal(FinishReason.ToolCall, final.FinishReason, "finish reason");
            Check.Equal("attack", final.ToolCall.Name, "the call's name");
            Check.Equal("thief", final.ToolCall.Arguments.GetString("target"), "its arguments, parsed");
            Check.Equal("{\"role\":\"user\",\"content\":\"Result of attack: {\\\"hit\\\":true}\"}",
                Json.Write(final.ToolCall.ResultMessage("{\"hit\":true}").ToJson()), "the result goes back as the call's outcome");
            Check.Equal("{\"name\":\"attack\",\"arguments\":{\"target\":\"thief\"}}", final.ToolCall.AssistantMessage().Content,
                "the call as the assistant turn");
            Check.True(GenerationFinal.FromJson(Json.ParseObject("{\"finishReason\":\"FINISH_REASON_STOP\"}")).ToolCall == null,
                "no call without toolCall");
            return Task.FromResult(0);
        }

        static Task BudgetTableChoice()
        {
            var table = new BudgetTable { Default = "2G" };
            table.ByQualityLevel["Ultra"] = "1G";
            table.ByScene["Boss"] = "512M";
            Check.Equal("512M", table.Choose("Boss", "Ultra"), "a scene's budget wins");
            Check.Equal("1G", table.Choose("Town", "Ultra"), "then the quality level's");
            Check.Equal("2G", table.Choose("Town", "Low"), "then the default");
            return Task.FromResult(0);
        }

        static Task Quoting()
        {
            var line = SidecarProcess.JoinArguments(new[] { "serve", "a b", "", "q\"x", "C:\\dir\\", "back\\\\\"slash" });
            Check.Equal("serve \"a b\" \"\" \"q\\\"x\" C:\\dir\\ \"back\\\\\\\\\\\"slash\"", line, "MSVC-style quoting");
            return Task.FromResult(0);
        }
    }
}
