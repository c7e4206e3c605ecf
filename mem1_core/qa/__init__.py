"""The question-answering domain (MEM1 §4.1): multi-objective questions over the embedded world
or real QA data (HotpotQA + NQ), searched through the run's retrieval index. Its tasks and world
(`tasks`), the paper's data stage (`paper_data`), its environment (`env`), its scripted teacher
(`teacher`) and its Domain (`domain`); the data it is made from (the world generator, the
composer, the QA loaders, EM) and the retrievers are the layers below (mem1_core.data,
mem1_core.retrieval)."""
