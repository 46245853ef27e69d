"""The protocol-neutral core of a node: what any protocol hands it to publish (ingress), topics and the
subscription trie, who reads which queue, notify dispatch, consumer groups, store writes and session events."""
