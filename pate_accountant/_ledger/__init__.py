"""The rooms of the privacy ledger; :mod:`pate_accountant.ledger` is the one public facade (docs/ledger.md, "Rooms").

* :mod:`.store`: the storage interface (``LedgerStore``) every store implements, and the layout versions;
* :mod:`.sqlite_store`, :mod:`.sqlite_files`: the SQLite store (the two files, their DDL and file handling);
* :mod:`.postgres_store`: the PostgreSQL store (transactions, rows, life cycle), on :mod:`.postgres_connection`
  (the connection, its timeouts and deadlines, every statement), :mod:`.postgres_schema` (the two schemas, creating
  and recognising a ledger) and :mod:`.postgres_url` (the URL, the ledger's name, the password never shown);
* :mod:`.chain`: the hash chains, the row check against the chain, and the pins (heads);
* :mod:`.verify`: full verification (``VerificationResult``);
* :mod:`.confidential`: teacher-set commitments, the confidential chain and its links to the shareable rows;
* :mod:`.runs`: runs, the data set name, run metadata and the claim protocol (a mixin of ``Ledger``);
* :mod:`.codec`: stored values <-> Python values and their format checks; the accountant configuration;
* :mod:`.transaction`: an accountant's position and the rows of one write transaction;
* :mod:`.errors`: the exceptions.
"""
