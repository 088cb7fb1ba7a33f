// The uGUI types the samples use (com.unity.ugui), with Unity's signatures; see UnityEngine.cs.
using UnityEngine.Events;

namespace UnityEngine.UI
{
    public class Text : Component
    {
        public string text { get; set; }
    }

    public class InputField : Component
    {
        public class SubmitEvent : UnityEvent<string> { }

        public string text { get; set; }
        public SubmitEvent onEndEdit { get; set; }
    }

    public class Button : Component
    {
        public class ButtonClickedEvent : UnityEvent { }

        public ButtonClickedEvent onClick { get; set; }
    }
}
