"""The web-search QA domain (MEM1's transfer experiment): the QA agent, trained on a local
index, answering through a web search API in Serper's JSON shape (`client`, with its on-disk
answer cache `cache`), tested against a local stand-in API over the run's own index
(`standin`), and the transfer evaluation that plays the same agents through both (`transfer`).
It is the QA domain with another search tool: its Domain (`domain`) changes only where the
agent's `<query>` goes."""
