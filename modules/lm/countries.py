"""Countries and the words that name them (demonyms, short forms, constituent parts), so that
"American", "United States" and "New Jersey" count as one country when a question asks whether
two things are from the same one. Data and one lookup; no LM.
"""

from __future__ import annotations

import re
from functools import lru_cache

# "Country: other names, demonyms, parts" one per line; the first name is the one returned.
_TABLE = """
Afghanistan: Afghan
Albania: Albanian
Algeria: Algerian
Andorra: Andorran
Angola: Angolan
Argentina: Argentine, Argentinian, Argentinean
Armenia: Armenian
Australia: Australian
Austria: Austrian, Austria-Hungary, Austro-Hungarian
Azerbaijan: Azerbaijani
Bahamas: Bahamian
Bahrain: Bahraini
Bangladesh: Bangladeshi
Barbados: Barbadian
Belarus: Belarusian, Byelorussian
Belgium: Belgian
Belize: Belizean
Benin: Beninese
Bhutan: Bhutanese
Bolivia: Bolivian
Bosnia and Herzegovina: Bosnia, Bosnian, Herzegovina
Botswana: Botswanan
Brazil: Brazilian
Brunei: Bruneian
Bulgaria: Bulgarian
Burkina Faso: Burkinabe
Cambodia: Cambodian
Cameroon: Cameroonian
Canada: Canadian, Quebec, Québec, Ontario, British Columbia, Alberta, Manitoba, Saskatchewan, Nova Scotia, New Brunswick, Newfoundland
Chad: Chadian
Chile: Chilean
China: Chinese, People's Republic of China, PRC
Colombia: Colombian
Congo: Congolese, Democratic Republic of the Congo, Republic of the Congo, Zaire
Costa Rica: Costa Rican
Croatia: Croatian, Croat
Cuba: Cuban
Cyprus: Cypriot
Czech Republic: Czech, Czechia, Czechoslovakia, Czechoslovak, Bohemia, Bohemian
Denmark: Danish
Dominican Republic: Dominican
Ecuador: Ecuadorian
Egypt: Egyptian
El Salvador: Salvadoran
Estonia: Estonian
Ethiopia: Ethiopian
Fiji: Fijian
Finland: Finnish
France: French, Frenchman, Frenchwoman
Georgia: Georgian
Germany: German, West Germany, East Germany, West German, East German, Prussia, Prussian, Bavaria, Bavarian, Weimar Republic, Nazi Germany
Ghana: Ghanaian
Greece: Greek, Hellenic
Guatemala: Guatemalan
Guinea: Guinean
Haiti: Haitian
Honduras: Honduran
Hong Kong: Hongkonger
Hungary: Hungarian, Magyar
Iceland: Icelandic, Icelander
India: Indian, British India, British Raj
Indonesia: Indonesian
Iran: Iranian, Persia, Persian
Iraq: Iraqi
Ireland: Irish, Republic of Ireland, Irish Free State
Israel: Israeli
Italy: Italian, Kingdom of Italy, Sicily, Sicilian
Ivory Coast: Ivorian, Côte d'Ivoire
Jamaica: Jamaican
Japan: Japanese
Jordan: Jordanian
Kazakhstan: Kazakh, Kazakhstani
Kenya: Kenyan
Kosovo: Kosovar
Kuwait: Kuwaiti
Kyrgyzstan: Kyrgyz
Laos: Lao, Laotian
Latvia: Latvian
Lebanon: Lebanese
Liberia: Liberian
Libya: Libyan
Liechtenstein: Liechtensteiner
Lithuania: Lithuanian
Luxembourg: Luxembourgish, Luxembourger
Madagascar: Malagasy
Malawi: Malawian
Malaysia: Malaysian
Mali: Malian
Malta: Maltese
Mauritius: Mauritian
Mexico: Mexican
Moldova: Moldovan
Monaco: Monegasque
Mongolia: Mongolian
Montenegro: Montenegrin
Morocco: Moroccan
Mozambique: Mozambican
Myanmar: Burma, Burmese
Namibia: Namibian
Nepal: Nepali, Nepalese
Netherlands: Dutch, Holland, Kingdom of the Netherlands
New Zealand: New Zealander
Nicaragua: Nicaraguan
Niger: Nigerien
Nigeria: Nigerian
North Korea: North Korean
North Macedonia: Macedonia, Macedonian
Norway: Norwegian
Oman: Omani
Pakistan: Pakistani
Palestine: Palestinian
Panama: Panamanian
Papua New Guinea: Papua New Guinean
Paraguay: Paraguayan
Peru: Peruvian
Philippines: Filipino, Filipina, Philippine
Poland: Polish
Portugal: Portuguese
Puerto Rico: Puerto Rican
Qatar: Qatari
Romania: Romanian, Rumanian
Russia: Russian, Russian Empire, Russian Federation
Rwanda: Rwandan
Saudi Arabia: Saudi, Saudi Arabian
Senegal: Senegalese
Serbia: Serbian, Serb, Yugoslavia, Yugoslav
Sierra Leone: Sierra Leonean
Singapore: Singaporean
Slovakia: Slovak, Slovakian
Slovenia: Slovene, Slovenian
Somalia: Somali
South Africa: South African
South Korea: South Korean, Korea, Korean
Soviet Union: Soviet, USSR, U.S.S.R.
Spain: Spanish, Spaniard, Catalonia, Catalan, Basque Country
Sri Lanka: Sri Lankan, Ceylon
Sudan: Sudanese
Sweden: Swedish, Swede
Switzerland: Swiss
Syria: Syrian
Taiwan: Taiwanese, Republic of China
Tajikistan: Tajik
Tanzania: Tanzanian
Thailand: Thai, Siam, Siamese
Trinidad and Tobago: Trinidadian, Tobagonian
Tunisia: Tunisian
Turkey: Turkish, Türkiye, Ottoman Empire, Ottoman
Turkmenistan: Turkmen
Uganda: Ugandan
Ukraine: Ukrainian
United Arab Emirates: Emirati, UAE
United Kingdom: UK, U.K., Britain, Great Britain, British, England, English, Scotland, Scottish, Wales, Welsh, Northern Ireland, Northern Irish, Kingdom of Great Britain
United States: United States of America, USA, U.S.A., US, U.S., America, American, Alabama, Alaska, Arizona, Arkansas, California, Colorado, Connecticut, Delaware, Florida, Hawaii, Idaho, Illinois, Indiana, Iowa, Kansas, Kentucky, Louisiana, Maine, Maryland, Massachusetts, Michigan, Minnesota, Mississippi, Missouri, Montana, Nebraska, Nevada, New Hampshire, New Jersey, New Mexico, New York, North Carolina, North Dakota, Ohio, Oklahoma, Oregon, Pennsylvania, Rhode Island, South Carolina, South Dakota, Tennessee, Texas, Utah, Vermont, Virginia, Washington, D.C., West Virginia, Wisconsin, Wyoming
Uruguay: Uruguayan
Uzbekistan: Uzbek
Venezuela: Venezuelan
Vietnam: Vietnamese, Viet Nam
Yemen: Yemeni
Zambia: Zambian
Zimbabwe: Zimbabwean, Rhodesia, Rhodesian
"""

# Names that hold a country's name but are no country: matched first, so that "South American"
# is not "American" and "Latin American" not "American".
_NOT_COUNTRIES = ("South America", "South American", "North America", "North American", "Latin America", "Latin American",
                  "Central America", "Central American", "Anglo-American")


_AS_WRITTEN = {"US", "U.S.", "USA", "U.S.A.", "UK", "U.K.", "UAE", "PRC", "USSR", "U.S.S.R."}


@lru_cache(maxsize=1)
def _names() -> tuple[re.Pattern, dict[str, str | None]]:
    country_of: dict[str, str | None] = {name.lower(): None for name in _NOT_COUNTRIES}
    for line in _TABLE.strip().splitlines():
        country, _, others = line.partition(":")
        for name in [country, *others.split(",")]:
            if name.strip():
                country_of[name.strip().lower()] = country.strip()
    # Longest first, so that "New Mexico" is read before "Mexico" and "North Korean" before "Korean";
    # the upper-case short forms ("US", "UK") only as written, so the word "us" is no country.
    names = sorted(country_of, key=len, reverse=True)
    parts = [re.escape(n.upper()) if n.upper() in _AS_WRITTEN else f"(?i:{re.escape(n)})" for n in names]
    return re.compile(rf"(?<![\w.])(?:{'|'.join(parts)})(?![\w])"), country_of


def countries_named(text: str) -> frozenset[str]:
    """The countries a text names by a name, a demonym or a part ("Greek-American" -> Greece and
    the United States; "Hamar, Norway" -> Norway); empty when it names none ("Trondheim")."""
    pattern, country_of = _names()
    found = {country_of[match.group().lower()] for match in pattern.finditer(text)}
    return frozenset(found - {None})
