using UnityEngine;
using UnityEngine.UI;
using Xlm.Sidecar.Unity;

namespace Xlm.Sidecar.Samples
{
    /// <summary>
    /// A chat with one NPC. Scene: a SidecarLauncher, a GameObject with NpcDialogue (its
    /// onTextChanged wired to `reply.text`, or set `reply` here), an InputField for the player's line,
    /// a Text for the reply and a Button for the structured action.
    /// </summary>
    public sealed class BlacksmithChat : MonoBehaviour
    {
        const string ActionSchema =
            "{\"type\":\"object\",\"properties\":{" +
            "\"action\":{\"enum\":[\"greet\",\"sell\",\"refuse\",\"attack\"]}," +
            "\"price\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":1000}}," +
            "\"required\":[\"action\"]}";

        [SerializeField] NpcDialogue blacksmith;
        [SerializeField] InputField playerLine;
        [SerializeField] Text reply;
        [SerializeField] Button haggle;

        void Start()
        {
            blacksmith.OnTextChanged.AddListener(text => reply.text = text);
            playerLine.onEndEdit.AddListener(line =>
            {
                if (line.Length == 0) return;
                blacksmith.Say(line); // streams into `reply`, token by token
                playerLine.text = "";
            });
            haggle.onClick.AddListener(Haggle);
        }

        void Update()
        {
            if (Input.GetKeyDown(KeyCode.Escape))
                blacksmith.Cancel(); // the daemon stops generating at once
            if (Input.GetKeyDown(KeyCode.F5))
                Save();
            if (Input.GetKeyDown(KeyCode.F9))
                Load();
        }

        // Save games: the conversation goes into the game's own save (PlayerPrefs here), with the KV
        // cache so Brom answers at once after a restart; quit, start again, press F9 and talk on.
        async void Save()
        {
            var save = await blacksmith.SaveAsync(includeKv: true);
            if (save != null)
                PlayerPrefs.SetString("brom-conversation", save);
        }

        async void Load()
        {
            var save = PlayerPrefs.GetString("brom-conversation", "");
            if (save.Length == 0)
                return;
            try
            {
                var restored = await blacksmith.LoadAsync(save);
                reply.text = "[Brom remembers you: " + restored.Restored + (restored.Reason.Length > 0 ? ", " + restored.Reason : "") + "]";
            }
            catch (System.Exception e)
            {
                Debug.LogException(e, this);  // a damaged save: INVALID_ARGUMENT, nothing changed
            }
        }

        async void Haggle()
        {
            try
            {
                var action = await blacksmith.ActAsync("The player offers 20 gold for a sword.", ActionSchema);
                reply.text = "[" + action.Object.GetString("action") + " " + action.Object.GetDouble("price") + "]";
            }
            catch (System.OperationCanceledException)
            {
                // Cancelled with Escape.
            }
            catch (System.Exception e)
            {
                Debug.LogException(e, this);
            }
        }
    }
}
